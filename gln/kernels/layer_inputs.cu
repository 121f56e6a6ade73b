// A layer's inputs in one launch: the bias logit, then the logits of the layer below.
//
// gln.network builds them with a fill, a subtraction, a division, a log and a copy, five
// launches per layer that weigh on a single-example learn. Here one thread writes one input:
//   inputs[t, g, 0]     = bias_logit
//   inputs[t, g, 1 + k] = from_probs ? logf(p / (1 - p)) : values[t, g, k]
// with p = values[t, g, k] the output of neuron k of GLN g below (already clipped to
// [eps, 1 - eps]), or the base logits for the first layer (groups = 1).

extern "C" __global__ void __launch_bounds__(128)
gln_layer_inputs(const float* __restrict__ values, int n, int groups, int width, int from_probs,
                 float bias_logit, float* __restrict__ inputs) {
    const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    const long long row_width = static_cast<long long>(width) + 1;
    if (at >= static_cast<long long>(n) * groups * row_width) return;
    const long long row = at / row_width;  // (t, g) flattened
    const long long column = at - row * row_width;
    if (column == 0) {
        inputs[at] = bias_logit;
        return;
    }
    const float value = values[row * width + column - 1];
    inputs[at] = from_probs ? logf(__fdiv_rn(value, __fsub_rn(1.0f, value))) : value;
}
