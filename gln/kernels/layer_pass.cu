// Algorithm 1 for one layer of Gated Linear Networks over a chunk of examples, on the GPU.
//
// Contract: gln.network.LayerPass (the same arguments and meaning as gln.kernels.cpu).
//   weights  (G, K, S, I) float32, updated in place; row w[g, k, c] is neuron (g, k) in context c
//   contexts (n, G, K) int32; inputs (n, 1 or G, I) float32 (bias logit first)
//   targets  (n, G) float32; rates (n,) float32; probs (n, G, K) float32, written
//   next_inputs (n, G, K + 1) float32, written when write_next: the next layer's inputs, the
//     bias logit then logf(p / (1 - p)) per neuron, as gln_layer_inputs (layer_inputs.cu) builds
//     them, so no launch between two layers has to
// For each example t in order and each neuron (g, k) with c = contexts[t, g, k]:
//   p       = clip(sigmoid(w[g, k, c] . x_t), lo, hi)
//   w[g,k,c] = clip(w[g, k, c] - rate_t * (p - target_t) * x_t, -bound, bound)   (when learning)
//
// Shape of the work: one warp owns one neuron and runs it through every example of its range,
// in order. A neuron at step t depends only on its own weights, the layer's inputs at t and the
// target, so neurons need no synchronisation and the layer over a chunk is a single launch.
// Lane l owns the elements j = l + 32 i (i < GLN_PER_LANE) of every row of its neuron: it is the
// only thread that ever reads or writes them, so program order alone makes each update visible
// to the next example that selects the same row.
//
// Exact and deterministic: every floating-point operation is an explicitly rounded intrinsic
// (fmaf, __fadd_rn, ...; the module is also compiled with --fmad=false), the per-lane partial
// sums have a fixed order and the warp reduction is a fixed butterfly. An example's result
// therefore depends only on I, the row and the input, never on n, on which kernel ran it, or on
// how a stream was cut into chunks: learning a chunk equals learning its rows one call at a time,
// byte for byte.
//
// Two kernels share that per-example code (run_neuron):
//   gln_layer_pass_streaming: the active row is read from and written back to global memory
//     for every example (the next example's row and input are loaded while the current one is
//     mixed). Best for short chunks; the only choice for prediction, which also splits the
//     examples of a neuron over several warps (rows_per_warp), since nothing is written.
//   gln_layer_pass_resident: the neuron's 2^m rows are copied to shared memory once (cp.async),
//     the chunk runs against them, and they are written back once. Weight traffic per chunk is
//     then 2 x S x I x 4 bytes per neuron instead of 2 x I x 4 bytes per example.
// A third learns with the same mixing code (mix_and_learn) and no run_neuron:
//   gln_layer_pass_rows: a warp per row, not per neuron. Row c of a neuron changes only at the
//     examples whose context is c, and nothing else reads it, so its warp takes those examples
//     alone (listed by gln_row_examples), in order, with the row in registers throughout: a
//     neuron's chunk becomes 2^m independent chains, as long as their contexts are common, and
//     no shared memory holds rows, so every neuron of a layer runs at once (the resident
//     kernel fits a few per SM).
// and prediction of long chunks has a fourth, which calls the same mixing code:
//   gln_layer_predict_shared: a block holds the rows of several neurons of one GLN in shared
//     memory and its warps take turns over the examples; a warp loads an example's input once
//     and mixes it with every neuron of the block. The streaming kernel reads a row and an
//     input from the caches for every neuron and example; this one reads the input once per
//     block and the rows from shared memory. On narrow rows a warp mixes GLN_SUM_BATCH
//     (neuron, example) pairs, then sums their dot products together, B - 1 shuffles for B
//     sums by the same additions as the butterfly's (batched_warp_sums), and squashes them and
//     writes their outputs at once, a lane each: per pair a warp spends its instructions on
//     the products. On wide rows, where the products outweigh the butterfly, it sums each
//     pair as it goes and squashes 32 finished sums at once. Two macros, which the host
//     sets (the same bytes each), change how: GLN_PREDICT_WARPS, more warps a block;
//     GLN_EXAMPLE_GROUP, on narrow rows a warp's examples taken several at once.
// Rows too wide for a lane's registers (more than 32 x 64 inputs) have a fifth, whose
// arithmetic is the others' in the same order (wide_lane_dot):
//   gln_layer_pass_wide: the streaming kernel's work with the active row and the input read
//     from memory as they are used, for rows of any width.
// A family of models (gln.family) has the streaming and the wide kernel's work per (member,
// neuron) pair:
//   gln_family_layer_pass(_wide): the chunk's rows grouped by member; a warp runs one neuron
//     of one member through that member's rows, in order, with run_neuron (run_neuron_wide),
//     so members run at once and each gets the bytes a model of its own would.
//
// GLN_PER_LANE = ceil(I / 32) is fixed at compile time (one module per value) so that a row
// and an input live in registers.

#ifndef GLN_PER_LANE
#define GLN_PER_LANE 25  // I = 785: MNIST's first layer (784 pixels and the bias)
#endif

// Prefetching the next row and input doubles the register arrays; beyond 32 per lane it would
// spill, so wide layers load after the store instead (same arithmetic, more latency).
#ifndef GLN_PREFETCH
#define GLN_PREFETCH (GLN_PER_LANE <= 32)
#endif

#define GLN_WARP 32
// (neuron, example) pairs whose dot products gln_layer_predict_shared sums at once; 1 keeps a
// butterfly per pair in a plain loop over the block's neurons. 16 won on an H200 for few values
// a lane (MNIST's layers), the plain loop for many (64 a lane on an H100).
#ifndef GLN_SUM_BATCH
#define GLN_SUM_BATCH (GLN_PER_LANE <= 26 ? 16 : 1)
#endif
// Examples a warp of gln_layer_predict_shared mixes at once where it batches its sums
// (GLN_SUM_BATCH > 1): 1 takes the block's pairs one by one, example after example; more
// groups them (see the kernel).
#ifndef GLN_EXAMPLE_GROUP
#define GLN_EXAMPLE_GROUP 1
#endif
#define GLN_FULL_MASK 0xffffffffu
#define GLN_STREAM_WARPS 4  // warps (neurons) per block of the streaming kernel
// Warps per block of gln_layer_predict_shared: as many as the registers allow without spilling
// (three register arrays per lane: the row, the input and the next input, and the parts of
// GLN_SUM_BATCH dot products; nvcc 13 for sm_90 spills none up to 64 per lane with these).
// The host may set more (gln.kernels.cuda.PREDICT_WARPS), with GLN_PREFETCH=0 beyond 16.
#ifndef GLN_PREDICT_WARPS
#define GLN_PREDICT_WARPS (GLN_PER_LANE <= 26 ? 16 : 8)
#endif
// Blocks (one warp each) of gln_layer_pass_rows an SM should hold: caps the registers a lane
// may take (65,536 / (32 x blocks)), 128 where the row and two inputs fit in them (120 for
// MNIST's first layer, 25 a lane; nvcc 13 spills at 32 a lane), 256 for wider rows.
#define GLN_ROW_BLOCKS (GLN_PER_LANE <= 26 ? 16 : 8)

#ifndef GLN_HOST_EMULATION
// Dynamic shared memory of the resident and shared-prediction kernels, 16-byte aligned for
// cp.async.
__device__ __forceinline__ float* dynamic_shared_floats() {
    extern __shared__ float4 gln_dynamic_shared[];
    return reinterpret_cast<float*>(gln_dynamic_shared);
}
#endif

// Sum over the warp by a fixed butterfly. IEEE addition is commutative, so at every step
// partner lanes compute the same value and all 32 lanes end with bitwise the same sum. From a
// later step (First < 16) it finishes sums that batched_warp_sums has begun.
template <int First = GLN_WARP / 2>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = First; offset > 0; offset >>= 1) {
        v = __fadd_rn(v, __shfl_xor_sync(GLN_FULL_MASK, v, offset));
    }
    return v;
}

// `p` as the compiler must take it: a register, its derivation forgotten. Elements at constant
// offsets from it are then addressed as register + immediate, one instruction each, where the
// compiler would otherwise keep each element's 64-bit index in a register of its own (hoisted
// out of the loop) and rebuild every address from it, four instructions an element.
template <typename T>
__device__ __forceinline__ T* opaque(T* p) {
#if defined(__CUDA_ARCH__)
    asm("" : "+l"(p));
#endif
    return p;
}

// Whether a lane's element i lies inside a row of num_inputs. The host compiles a module for
// GLN_PER_LANE = ceil(I / 32) (gln.kernels.cuda.per_lane), so I > 32 (GLN_PER_LANE - 1) and
// every element but the last is inside: with i a constant (unrolled loops) only the last one
// costs a comparison and a predicated access, not all of them.
__device__ __forceinline__ bool inside_row(int i, int lane, int num_inputs) {
    return i < GLN_PER_LANE - 1 || lane + GLN_WARP * i < num_inputs;
}

// A lane's elements of a weight row (shared or global memory); zeros past the end. The lane's
// first element is addressed once and the others at constant offsets from it.
__device__ __forceinline__ void load_row(float (&r)[GLN_PER_LANE], const float* row, int lane,
                                         int num_inputs) {
    const float* mine = row + lane;
#pragma unroll
    for (int i = 0; i < GLN_PER_LANE; ++i) {
        r[i] = inside_row(i, lane, num_inputs) ? mine[GLN_WARP * i] : 0.0f;
    }
}

__device__ __forceinline__ void store_row(float* row, const float (&r)[GLN_PER_LANE], int lane,
                                          int num_inputs) {
    float* mine = row + lane;
#pragma unroll
    for (int i = 0; i < GLN_PER_LANE; ++i) {
        if (inside_row(i, lane, num_inputs)) mine[GLN_WARP * i] = r[i];
    }
}

// A lane's elements of an input row: read-only for the whole launch, so through the
// read-only cache (every neuron of a GLN reads the same row).
__device__ __forceinline__ void load_input(float (&r)[GLN_PER_LANE],
                                           const float* __restrict__ row, int lane,
                                           int num_inputs) {
    const float* __restrict__ mine = opaque(row + lane);
#pragma unroll
    for (int i = 0; i < GLN_PER_LANE; ++i) {
        r[i] = inside_row(i, lane, num_inputs) ? __ldg(mine + GLN_WARP * i) : 0.0f;
    }
}

// The clipped sigmoid of a neuron's dot product.
__device__ __forceinline__ float squash(float dot, float lo, float hi) {
    const float p = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-dot)));
    return fminf(fmaxf(p, lo), hi);
}

// This lane's part of a row's dot product with an input: what warp_sum adds up.
__device__ __forceinline__ float lane_dot(const float (&w)[GLN_PER_LANE],
                                          const float (&x)[GLN_PER_LANE]) {
    // Two interleaved partial sums shorten the dependency chain; their order is fixed.
    float even = 0.0f, odd = 0.0f;
#pragma unroll
    for (int i = 0; i < GLN_PER_LANE; i += 2) even = fmaf(w[i], x[i], even);
#pragma unroll
    for (int i = 1; i < GLN_PER_LANE; i += 2) odd = fmaf(w[i], x[i], odd);
    return __fadd_rn(even, odd);
}

// A row's dot product with an input, on every lane of the warp.
__device__ __forceinline__ float warp_dot(const float (&w)[GLN_PER_LANE],
                                          const float (&x)[GLN_PER_LANE]) {
    return warp_sum(lane_dot(w, x));
}

// Halving `Step` of batched_warp_sums and the ones after it, one template per step so that
// every bound and index is a constant and `part` stays in registers.
template <int Step, int B>
__device__ __forceinline__ void halve_sums(float (&part)[B], int lane) {
    if constexpr ((B >> Step) > 1) {
        constexpr int kWidth = B >> Step, kOffset = (GLN_WARP / 2) >> Step;
        const bool upper = (lane & kOffset) != 0;
#pragma unroll
        for (int i = 0; i < kWidth / 2; ++i) {
            const float low = part[i], high = part[i + kWidth / 2];  // values, not places:
            const float keep = upper ? high : low;  // a choice between two places would keep
            const float give = upper ? low : high;  // the array in (local) memory
            part[i] = __fadd_rn(keep, __shfl_xor_sync(GLN_FULL_MASK, give, kOffset));
        }
        halve_sums<Step + 1>(part, lane);
    }
}

// B dot products summed at once (B a power of two, at most 32), each exactly as warp_sum sums
// one: part[i] is this lane's part of dot i, and lane l ends with dot l / (32 / B). At the
// butterfly's step with offset o, lane l adds lane l ^ o's value to its own; here, while more
// than one dot is left, lane l keeps half of its dots (the upper half where l has bit o) and
// receives lane l ^ o's value of each, which holds the same dots' sums so far: the same
// additions of the same operands, B - 1 shuffles for B dots instead of 5 B. The steps left
// once each lane holds one dot are warp_sum's own.
template <int B>
__device__ __forceinline__ float batched_warp_sums(float (&part)[B], int lane) {
    static_assert(B >= 1 && B <= GLN_WARP && (B & (B - 1)) == 0, "B: a power of two <= 32");
    halve_sums<0>(part, lane);
    return warp_sum<GLN_WARP / 2 / B>(part[0]);
}

// Lines 10-13 of Algorithm 1 for one neuron and one example: geometric mixing, clipping, and
// (when learning) the gradient step and projection, in registers. Returns p on every lane.
__device__ __forceinline__ float mix_and_learn(float (&w)[GLN_PER_LANE],
                                               const float (&x)[GLN_PER_LANE], float rate,
                                               float target, float lo, float hi, float bound,
                                               bool learn) {
    const float p = squash(warp_dot(w, x), lo, hi);
    if (learn) {
        // The step uses the clipped p, as the paper's analytic gradient does.
        const float step = __fmul_rn(rate, __fsub_rn(p, target));
#pragma unroll
        for (int i = 0; i < GLN_PER_LANE; ++i) {
            w[i] = fminf(fmaxf(fmaf(-step, x[i], w[i]), -bound), bound);
        }
    }
    return p;
}

struct LayerArgs {
    const int* contexts;
    const float* inputs;
    const float* targets;
    const float* rates;
    float* probs;
    float* next_inputs;
    int n, num_glns, num_neurons, num_contexts, num_inputs, input_groups;
    float lo, hi, bound, bias_logit;
    bool learn, write_next;
};

// The next layer's input from a neuron's output p.
__device__ __forceinline__ float input_logit(float p) {
    return logf(__fdiv_rn(p, __fsub_rn(1.0f, p)));
}

// One lane's outputs for neuron `neuron` at example t: p, and the next layer's input from it
// (and the bias, once per GLN and example, by neuron 0).
__device__ __forceinline__ void write_outputs(const LayerArgs& a, long long neuron, int g, int t,
                                              float p) {
    const long long per_example = static_cast<long long>(a.num_glns) * a.num_neurons;
    a.probs[t * per_example + neuron] = p;
    if (a.write_next) {
        const int k = static_cast<int>(neuron - static_cast<long long>(g) * a.num_neurons);
        float* row = a.next_inputs + (static_cast<long long>(t) * a.num_glns + g) *
                                         (a.num_neurons + 1LL);
        row[1 + k] = input_logit(p);
        if (k == 0) row[0] = a.bias_logit;
    }
}

// Per-example scalars for a window of 32 examples: lane l holds example window + l. One
// (scattered) load per lane serves 32 examples; __shfl_sync hands each example to the warp.
struct Window {
    int context;
    float rate, target;
};

__device__ __forceinline__ Window load_window(const LayerArgs& a, long long neuron, int g,
                                              int first, int end, int lane) {
    Window s = {0, 0.0f, 0.0f};
    const int t = first + lane;
    if (t < end) {
        const long long per_example = static_cast<long long>(a.num_glns) * a.num_neurons;
        // Contexts are 2^m-bit signatures; the mask keeps a bad one inside the neuron's rows.
        s.context = a.contexts[t * per_example + neuron] & (a.num_contexts - 1);
        s.rate = a.rates[t];
        s.target = a.targets[static_cast<long long>(t) * a.num_glns + g];
    }
    return s;
}

// Where run_neuron is in its chunk: the current example's context, and the window of per-example
// scalars that holds it.
struct NeuronCursor {
    int c, window;
    Window s;
};

// Example t of run_neuron: mixes (and learns) it with the row and input in `w` and `x`, and
// leaves example t + 1's in `w_next` and `x_next`. With GLN_PREFETCH they are other registers,
// loaded before the mixing of t (row c_next != c is not written at t; any earlier write to it
// was issued earlier by this same lane), and run_neuron swaps the two pairs' roles from one
// example to the next, so nothing is copied between them except the updated row when t + 1
// has the same context (one time in 2^m). Without it (wide rows, where two pairs would not
// fit in registers) they are the same registers, loaded after the store.
__device__ __forceinline__ void neuron_step(float (&w)[GLN_PER_LANE], float (&x)[GLN_PER_LANE],
                                            float (&w_next)[GLN_PER_LANE],
                                            float (&x_next)[GLN_PER_LANE], float* rows,
                                            const LayerArgs& a, const float* input0,
                                            long long input_stride, long long neuron, int g,
                                            int t, int end, int lane, NeuronCursor& at) {
    const int I = a.num_inputs;
    const float rate = __shfl_sync(GLN_FULL_MASK, at.s.rate, t - at.window);
    const float target = __shfl_sync(GLN_FULL_MASK, at.s.target, t - at.window);
    const bool more = t + 1 < end;
    int c_next = at.c;
    if (more) {
        if (t + 1 - at.window == GLN_WARP) {
            at.window += GLN_WARP;
            at.s = load_window(a, neuron, g, at.window, end, lane);
        }
        c_next = __shfl_sync(GLN_FULL_MASK, at.s.context, t + 1 - at.window);
#if GLN_PREFETCH
        load_input(x_next, input0 + (t + 1) * input_stride, lane, I);
        if (c_next != at.c) {
            load_row(w_next, rows + static_cast<long long>(c_next) * I, lane, I);
        }
#endif
    }

    const float p = mix_and_learn(w, x, rate, target, a.lo, a.hi, a.bound, a.learn);
    if (lane == 0) write_outputs(a, neuron, g, t, p);
    if (a.learn) store_row(rows + static_cast<long long>(at.c) * I, w, lane, I);

    if (more) {
#if GLN_PREFETCH
        if (c_next == at.c) {  // the updated row, already in registers
            // A branch taken one time in 2^m: the empty asm keeps the compiler from turning the
            // copy into a select of every element on every example.
            asm volatile("");
#pragma unroll
            for (int i = 0; i < GLN_PER_LANE; ++i) w_next[i] = w[i];
        }
#else
        if (c_next != at.c) load_row(w_next, rows + static_cast<long long>(c_next) * I, lane, I);
        load_input(x_next, input0 + (t + 1) * input_stride, lane, I);
#endif
        at.c = c_next;
    }
}

// Neuron (g, k) through examples [begin, end) in order. `rows` is the neuron's S x I weights,
// in global memory (streaming) or in shared memory (resident).
__device__ __forceinline__ void run_neuron(float* rows, const LayerArgs& a, long long neuron,
                                           int g, int begin, int end, int lane) {
    const int I = a.num_inputs;
    const int source = a.input_groups == 1 ? 0 : g;
    const long long input_stride = static_cast<long long>(a.input_groups) * I;
    const float* input0 = a.inputs + static_cast<long long>(source) * I;

    NeuronCursor at;
    at.window = begin;
    at.s = load_window(a, neuron, g, at.window, end, lane);
    at.c = __shfl_sync(GLN_FULL_MASK, at.s.context, 0);
    float w[GLN_PER_LANE], x[GLN_PER_LANE];
    load_row(w, rows + static_cast<long long>(at.c) * I, lane, I);
    load_input(x, input0 + begin * input_stride, lane, I);
#if GLN_PREFETCH
    float w_next[GLN_PER_LANE], x_next[GLN_PER_LANE];
    for (int t = begin; t < end; t += 2) {  // the pairs' roles alternate
        neuron_step(w, x, w_next, x_next, rows, a, input0, input_stride, neuron, g, t, end, lane,
                    at);
        if (t + 1 < end) {
            neuron_step(w_next, x_next, w, x, rows, a, input0, input_stride, neuron, g, t + 1,
                        end, lane, at);
        }
    }
#else
    for (int t = begin; t < end; ++t) {
        neuron_step(w, x, w, x, rows, a, input0, input_stride, neuron, g, t, end, lane, at);
    }
#endif
}

__device__ __forceinline__ LayerArgs layer_args(const int* contexts, const float* inputs,
                                                const float* targets, const float* rates,
                                                float* probs, float* next_inputs, int n,
                                                int num_glns, int num_neurons, int num_contexts,
                                                int num_inputs, int input_groups, float lo,
                                                float hi, float bound, int learn,
                                                float bias_logit, int write_next) {
    LayerArgs a;
    a.contexts = contexts;
    a.inputs = inputs;
    a.targets = targets;
    a.rates = rates;
    a.probs = probs;
    a.next_inputs = next_inputs;
    a.n = n;
    a.num_glns = num_glns;
    a.num_neurons = num_neurons;
    a.num_contexts = num_contexts;
    a.num_inputs = num_inputs;
    a.input_groups = input_groups;
    a.lo = lo;
    a.hi = hi;
    a.bound = bound;
    a.bias_logit = bias_logit;
    a.learn = learn != 0;
    a.write_next = write_next != 0;
    return a;
}

// The three layer kernels' parameters: one signature, so the host builds one argument list.
#define GLN_LAYER_KERNEL_PARAMETERS                                                             \
    float *weights, const int *__restrict__ contexts, const float *__restrict__ inputs,          \
        const float *__restrict__ targets, const float *__restrict__ rates,                     \
        float *__restrict__ probs, float *__restrict__ next_inputs, int n, int num_glns,        \
        int num_neurons, int num_contexts, int num_inputs, int input_groups, float lo, float hi, \
        float bound, int learn, float bias_logit, int write_next, int rows_per_warp,            \
        int neurons_per_block

#define GLN_LAYER_KERNEL_ARGUMENTS                                                              \
    weights, contexts, inputs, targets, rates, probs, next_inputs, n, num_glns, num_neurons,    \
        num_contexts, num_inputs, input_groups, lo, hi, bound, learn, bias_logit, write_next,  \
        rows_per_warp, neurons_per_block

// This lane's part of a row's dot product with an input, the row and the input read from
// memory as it goes: lane_dot's two chains (the even and the odd elements of the lane, each in
// order) for rows of any width, where lane_dot's register arrays would not fit.
__device__ __forceinline__ float wide_lane_dot(const float* row, const float* __restrict__ x,
                                               int lane, int num_inputs) {
    float even = 0.0f, odd = 0.0f;
    for (int j = lane; j < num_inputs; j += 2 * GLN_WARP) {
        even = fmaf(row[j], __ldg(x + j), even);
        if (j + GLN_WARP < num_inputs) odd = fmaf(row[j + GLN_WARP], __ldg(x + j + GLN_WARP), odd);
    }
    return __fadd_rn(even, odd);
}

// run_neuron for rows wider than a lane's registers hold: neuron (g, k) through examples
// [begin, end) in order, its active row and the input read from memory as they are used, in
// the same order of operations as mix_and_learn (lane l owns elements l + 32 i, for both the
// dot product and the update, so program order makes each update visible).
__device__ __forceinline__ void run_neuron_wide(float* rows, const LayerArgs& a,
                                                long long neuron, int g, int begin, int end,
                                                int lane) {
    const int I = a.num_inputs;
    const long long input_stride = static_cast<long long>(a.input_groups) * I;
    const float* input0 = a.inputs + static_cast<long long>(a.input_groups == 1 ? 0 : g) * I;
    int window = begin;
    Window s = load_window(a, neuron, g, window, end, lane);
    for (int t = begin; t < end; ++t) {
        if (t - window == GLN_WARP) {
            window += GLN_WARP;
            s = load_window(a, neuron, g, window, end, lane);
        }
        const int c = __shfl_sync(GLN_FULL_MASK, s.context, t - window);
        const float rate = __shfl_sync(GLN_FULL_MASK, s.rate, t - window);
        const float target = __shfl_sync(GLN_FULL_MASK, s.target, t - window);
        float* row = rows + static_cast<long long>(c) * I;
        const float* x = input0 + t * input_stride;
        const float p = squash(warp_sum(wide_lane_dot(row, x, lane, I)), a.lo, a.hi);
        if (lane == 0) write_outputs(a, neuron, g, t, p);
        if (a.learn) {
            const float step = __fmul_rn(rate, __fsub_rn(p, target));
            for (int j = lane; j < I; j += GLN_WARP) {
                row[j] = fminf(fmaxf(fmaf(-step, __ldg(x + j), row[j]), -a.bound), a.bound);
            }
        }
    }
}

// One warp per neuron, GLN_STREAM_WARPS neurons per block; blockIdx.y picks a range of
// rows_per_warp examples (the whole chunk when learning: gridDim.y must then be 1). The
// streaming kernel runs its neuron with run_neuron, the wide kernel with run_neuron_wide.
template <bool Wide>
__device__ __forceinline__ void warp_per_neuron(GLN_LAYER_KERNEL_PARAMETERS) {
    (void)neurons_per_block;  // one neuron per warp: the kernels share one signature
    const int lane = threadIdx.x % GLN_WARP;
    const long long neuron =
        static_cast<long long>(blockIdx.x) * (blockDim.x / GLN_WARP) + threadIdx.x / GLN_WARP;
    if (neuron >= static_cast<long long>(num_glns) * num_neurons) return;  // whole warp
    const long long first = static_cast<long long>(blockIdx.y) * rows_per_warp;
    if (first >= n) return;
    const int begin = static_cast<int>(first);
    const int end = n - begin < rows_per_warp ? n : begin + rows_per_warp;
    const LayerArgs a = layer_args(contexts, inputs, targets, rates, probs, next_inputs, n,
                                   num_glns, num_neurons, num_contexts, num_inputs, input_groups,
                                   lo, hi, bound, learn, bias_logit, write_next);
    const int g = static_cast<int>(neuron / num_neurons);
    float* rows = weights + neuron * num_contexts * static_cast<long long>(num_inputs);
    if constexpr (Wide) {
        run_neuron_wide(rows, a, neuron, g, begin, end, lane);
    } else {
        run_neuron(rows, a, neuron, g, begin, end, lane);
    }
}

extern "C" __global__ void __launch_bounds__(GLN_WARP * GLN_STREAM_WARPS)
gln_layer_pass_streaming(GLN_LAYER_KERNEL_PARAMETERS) {
    warp_per_neuron<false>(GLN_LAYER_KERNEL_ARGUMENTS);
}

// Rows wider than a lane's registers hold (the host sends layers of more than 32 x 64 inputs
// here; mode="wide" any layer): the streaming kernel's launch and work, with each row and
// input read from memory as they are used.
extern "C" __global__ void __launch_bounds__(GLN_WARP * GLN_STREAM_WARPS)
gln_layer_pass_wide(GLN_LAYER_KERNEL_PARAMETERS) {
    warp_per_neuron<true>(GLN_LAYER_KERNEL_ARGUMENTS);
}

// A family of models' layer (gln.family): weights (M, G, K, S, I), member m's neurons at
// weights + m * G * K * S * I, and a chunk whose rows are grouped by member (stably: a member's
// rows keep their order). Run r is member run_members[r]'s rows [run_starts[r],
// run_starts[r + 1]); no member has two runs. A warp takes one (run, neuron) pair and runs the
// neuron through the run's rows with run_neuron (run_neuron_wide), exactly as the streaming
// (wide) kernel runs it through a model's chunk: each member gets the bytes a model of its own
// gets on its rows alone, and the runs of different members, which touch different weights,
// run at once. Warps as warp_per_neuron's (blockIdx.x); blockIdx.y picks the run, looping over
// those beyond the grid. Prediction writes no weight, so the host may cut a member's rows into
// several runs there, to be taken by several warps.
template <bool Wide>
__device__ __forceinline__ void warp_per_member_neuron(GLN_LAYER_KERNEL_PARAMETERS,
                                                       const long long* __restrict__ run_members,
                                                       const long long* __restrict__ run_starts,
                                                       int runs) {
    (void)rows_per_warp;  // a run's rows: the runs say where each warp's examples are
    (void)neurons_per_block;
    const int lane = threadIdx.x % GLN_WARP;
    const long long neurons = static_cast<long long>(num_glns) * num_neurons;
    const long long neuron =
        static_cast<long long>(blockIdx.x) * (blockDim.x / GLN_WARP) + threadIdx.x / GLN_WARP;
    if (neuron >= neurons) return;  // whole warp
    const LayerArgs a = layer_args(contexts, inputs, targets, rates, probs, next_inputs, n,
                                   num_glns, num_neurons, num_contexts, num_inputs, input_groups,
                                   lo, hi, bound, learn, bias_logit, write_next);
    const int g = static_cast<int>(neuron / num_neurons);
    const long long neuron_size = static_cast<long long>(num_contexts) * num_inputs;
    for (int run = blockIdx.y; run < runs; run += gridDim.y) {
        const int begin = static_cast<int>(run_starts[run]);
        const int end = static_cast<int>(run_starts[run + 1]);
        if (begin >= end) continue;  // whole warp
        float* rows = weights + (run_members[run] * neurons + neuron) * neuron_size;
        if constexpr (Wide) {
            run_neuron_wide(rows, a, neuron, g, begin, end, lane);
        } else {
            run_neuron(rows, a, neuron, g, begin, end, lane);
        }
    }
}

#define GLN_FAMILY_LAYER_KERNEL_PARAMETERS                                                      \
    GLN_LAYER_KERNEL_PARAMETERS, const long long *__restrict__ run_members,                     \
        const long long *__restrict__ run_starts, int runs

extern "C" __global__ void __launch_bounds__(GLN_WARP * GLN_STREAM_WARPS)
gln_family_layer_pass(GLN_FAMILY_LAYER_KERNEL_PARAMETERS) {
    warp_per_member_neuron<false>(GLN_LAYER_KERNEL_ARGUMENTS, run_members, run_starts, runs);
}

// The family's layers of rows wider than a lane's registers hold, as gln_layer_pass_wide.
extern "C" __global__ void __launch_bounds__(GLN_WARP * GLN_STREAM_WARPS)
gln_family_layer_pass_wide(GLN_FAMILY_LAYER_KERNEL_PARAMETERS) {
    warp_per_member_neuron<true>(GLN_LAYER_KERNEL_ARGUMENTS, run_members, run_starts, runs);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
        : "=r"(address)
        : "l"(p));
    return address;
}
#endif

// Copy `size` floats of weight rows from global to shared memory, thread `thread` of `threads`
// taking every threads-th element; the caller synchronises the threads that shared the copy.
// cp.async (sm_80+) keeps every request in flight at once instead of a few per thread, so the
// copy runs at memory bandwidth rather than at memory latency.
__device__ __forceinline__ void rows_to_shared(float* dst, const float* src, long long size,
                                               int thread, int threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const bool vector = ((reinterpret_cast<unsigned long long>(src) |
                          reinterpret_cast<unsigned long long>(dst)) & 15) == 0 &&
                        (size & 3) == 0;
    if (vector) {
        for (long long e = 4LL * thread; e < size; e += 4LL * threads) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                         :: "r"(shared_address(dst + e)), "l"(src + e) : "memory");
        }
    } else {
        for (long long e = thread; e < size; e += threads) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
                         :: "r"(shared_address(dst + e)), "l"(src + e) : "memory");
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
    for (long long e = thread; e < size; e += threads) dst[e] = src[e];
#endif
}

__device__ __forceinline__ void rows_to_global(float* dst, const float* src, long long size,
                                               int lane) {
#if defined(__CUDA_ARCH__)
    const bool vector = ((reinterpret_cast<unsigned long long>(src) |
                          reinterpret_cast<unsigned long long>(dst)) & 15) == 0 &&
                        (size & 3) == 0;
    if (vector) {
        const float4* from = reinterpret_cast<const float4*>(src);
        float4* to = reinterpret_cast<float4*>(dst);
        for (long long e = lane; e < size / 4; e += GLN_WARP) to[e] = from[e];
        return;
    }
#endif
    for (long long e = lane; e < size; e += GLN_WARP) dst[e] = src[e];
}

// One warp (block) per neuron; S x I x 4 bytes of dynamic shared memory hold its rows.
extern "C" __global__ void __launch_bounds__(GLN_WARP)
gln_layer_pass_resident(GLN_LAYER_KERNEL_PARAMETERS) {
    (void)rows_per_warp;  // the kernels share one signature; always the whole chunk
    (void)neurons_per_block;
    const int lane = threadIdx.x % GLN_WARP;
    const long long neuron = blockIdx.x;
    if (neuron >= static_cast<long long>(num_glns) * num_neurons || n <= 0) return;
    const LayerArgs a = layer_args(contexts, inputs, targets, rates, probs, next_inputs, n,
                                   num_glns, num_neurons, num_contexts, num_inputs, input_groups,
                                   lo, hi, bound, learn, bias_logit, write_next);
    const long long size = static_cast<long long>(num_contexts) * num_inputs;
    float* global_rows = weights + neuron * size;
    float* rows = dynamic_shared_floats();
    rows_to_shared(rows, global_rows, size, lane, GLN_WARP);
    __syncwarp();  // the copy's lane layout differs from run_neuron's
    run_neuron(rows, a, neuron, static_cast<int>(neuron / num_neurons), 0, n, lane);
    if (a.learn) {
        __syncwarp();
        rows_to_global(global_rows, rows, size, lane);
    }
}

// Where a row's warp reads and writes, example t at t times a stride from each: computed once,
// so that an example costs one multiply-add an address.
struct RowPlaces {
    const int* examples;  // the row's examples, in order (gln_row_examples)
    int count;            // how many
    const float* input0;
    const float* targets;  // its GLN's
    float* probs;          // the neuron's
    float* next_row;       // its GLN's next-layer inputs
    int per_example, input_stride, next_stride, k;
};

// Per-example values for a window of 32 of a row's examples: lane l holds its (window + l)-th
// example (a.n past its last), and that example's rate and target. One load per lane serves 32
// examples; __shfl_sync hands each to the warp.
__device__ __forceinline__ Window load_row_window(const LayerArgs& a, const RowPlaces& places,
                                                  int first, int lane, int& t) {
    Window s = {0, 0.0f, 0.0f};
    t = a.n;
    if (first + lane < places.count) {
        t = places.examples[first + lane];
        s.rate = __ldg(a.rates + t);
        s.target = __ldg(places.targets + static_cast<long long>(t) * a.num_glns);
    }
    return s;
}

// Where a row's warp is in its examples: the window of 32 that holds the next one, and the
// lane's example of it (t, from load_row_window) with its rate and target.
struct RowCursor {
    int window, t;
    Window s;
};

// The row's i-th example (a.n past its last), and its rate and target, on every lane; loads
// the next window when i is past this one.
__device__ __forceinline__ int row_example(const LayerArgs& a, const RowPlaces& places, int i,
                                           int lane, RowCursor& at, float& rate,
                                           float& target) {
    if (i - at.window == GLN_WARP) {
        at.window += GLN_WARP;
        at.s = load_row_window(a, places, at.window, lane, at.t);
    }
    rate = __shfl_sync(GLN_FULL_MASK, at.s.rate, i - at.window);
    target = __shfl_sync(GLN_FULL_MASK, at.s.target, i - at.window);
    return __shfl_sync(GLN_FULL_MASK, at.t, i - at.window);
}

// The i-th example t of row c's warp: mixes (and learns) it with the row `w` and its input `x`,
// and leaves the next example's input in `x_next` (with GLN_PREFETCH loaded before the mixing,
// other registers, and the caller swaps the two inputs' roles from one example to the next),
// its rate and target in `rate` and `target`. Returns the next example (a.n when none is left).
__device__ __forceinline__ int row_step(float (&w)[GLN_PER_LANE], float (&x)[GLN_PER_LANE],
                                        float (&x_next)[GLN_PER_LANE], const LayerArgs& a,
                                        const RowPlaces& places, int i, int t, float& rate,
                                        float& target, int lane, RowCursor& at) {
    const int I = a.num_inputs;
    float rate_next, target_next;
    const int next = row_example(a, places, i + 1, lane, at, rate_next, target_next);
    const long long ahead = next;
#if GLN_PREFETCH
    if (next < a.n) load_input(x_next, places.input0 + ahead * places.input_stride, lane, I);
#endif
    const float p = mix_and_learn(w, x, rate, target, a.lo, a.hi, a.bound, a.learn);
    if (lane == 0) {
        const long long now = t;
        places.probs[now * places.per_example] = p;
        // The stores write_outputs makes, from addresses computed once (a store helper that
        // both called moved the resident kernel's address arithmetic onto the uniform
        // datapath: 32 instructions more a pair of examples).
        if (a.write_next) {
            float* row = places.next_row + now * places.next_stride;
            row[1 + places.k] = input_logit(p);
            if (places.k == 0) row[0] = a.bias_logit;
        }
    }
#if !GLN_PREFETCH
    if (next < a.n) load_input(x_next, places.input0 + ahead * places.input_stride, lane, I);
#endif
    rate = rate_next;
    target = target_next;
    return next;
}

// One warp (block) per row: row c of neuron (g, k) is (g * K + k) * S + c, block
// row_order[blockIdx.x]'s when `ordered` (gln_row_order: the longest chains first), else block
// blockIdx.x's, and its warp takes the examples whose context is c (listed by
// gln_row_examples: `counts` of them from `starts` in the neuron's n `examples`), in order,
// with the row in registers from the first to the last. A row's updates depend only on its
// own examples, in their order, so the rows of a neuron need no synchronisation either, and
// each example is mixed by mix_and_learn exactly as the other kernels mix it: the same bytes.
// A neuron's chunk is then S chains instead of one, each as long as its context is common, and
// nothing is held in shared memory, so every neuron of a layer runs at once where the resident
// kernel's rows fit a few neurons an SM.
extern "C" __global__ void __launch_bounds__(GLN_WARP, GLN_ROW_BLOCKS)
gln_layer_pass_rows(GLN_LAYER_KERNEL_PARAMETERS, const int* __restrict__ examples,
                    const int* __restrict__ counts, const int* __restrict__ starts,
                    const int* __restrict__ row_order, int ordered) {
    (void)rows_per_warp;  // the kernels share one signature; always the whole chunk
    (void)neurons_per_block;
    const int lane = threadIdx.x % GLN_WARP;
    const long long row = ordered ? row_order[blockIdx.x] : blockIdx.x;
    const long long neuron = row / num_contexts;
    if (neuron >= static_cast<long long>(num_glns) * num_neurons || n <= 0) return;
    if (counts[row] == 0) return;  // no example selects the row: it stays as it is
    const LayerArgs a = layer_args(contexts, inputs, targets, rates, probs, next_inputs, n,
                                   num_glns, num_neurons, num_contexts, num_inputs, input_groups,
                                   lo, hi, bound, learn, bias_logit, write_next);
    const int g = static_cast<int>(neuron / num_neurons);
    const int k = static_cast<int>(neuron - static_cast<long long>(g) * num_neurons);
    RowPlaces places;
    places.examples = examples + neuron * n + starts[row];
    places.count = counts[row];
    places.per_example = num_glns * num_neurons;
    places.input_stride = input_groups * num_inputs;
    places.next_stride = num_glns * (num_neurons + 1);
    places.input0 = inputs + static_cast<long long>(input_groups == 1 ? 0 : g) * num_inputs;
    places.targets = targets + g;
    places.probs = probs + neuron;
    places.next_row = next_inputs + static_cast<long long>(g) * (num_neurons + 1);
    places.k = k;

    RowCursor at;
    at.window = 0;
    at.s = load_row_window(a, places, 0, lane, at.t);
    float rate, target;
    int t = row_example(a, places, 0, lane, at, rate, target);
    const int I = num_inputs;
    float* weights_row = weights + row * I;
    float w[GLN_PER_LANE], x[GLN_PER_LANE];
    load_row(w, weights_row, lane, I);
    load_input(x, places.input0 + static_cast<long long>(t) * places.input_stride, lane, I);
    int i = 0;
#if GLN_PREFETCH
    float x_next[GLN_PER_LANE];
    while (t < n) {  // the two inputs' roles alternate
        t = row_step(w, x, x_next, a, places, i++, t, rate, target, lane, at);
        if (t < n) t = row_step(w, x_next, x, a, places, i++, t, rate, target, lane, at);
    }
#else
    while (t < n) t = row_step(w, x, x, a, places, i++, t, rate, target, lane, at);
#endif
    if (a.learn) store_row(weights_row, w, lane, I);
}

// Each row's examples for gln_layer_pass_rows: for neuron `neuron`, examples[neuron * n + ...]
// lists its chunk's examples by context (contexts masked as the layer passes mask them), each
// context's in order, counts[neuron * S + c] of context c from starts[neuron * S + c]. One warp
// (block) per neuron, S ints of dynamic shared memory: the counts, then where each context's
// next example goes. A window of 32 examples is placed at once: the lanes of one context (found
// by __match_any_sync) take consecutive places, in lane order.
extern "C" __global__ void __launch_bounds__(GLN_WARP)
gln_row_examples(const int* __restrict__ contexts, int n, int neurons, int num_contexts,
                 int* __restrict__ examples, int* __restrict__ counts, int* __restrict__ starts) {
    const int neuron = blockIdx.x;
    if (neuron >= neurons) return;
    const int lane = threadIdx.x;
    int* next = reinterpret_cast<int*>(dynamic_shared_floats());
    const int* column = contexts + neuron;
    for (int c = lane; c < num_contexts; c += GLN_WARP) next[c] = 0;
    __syncwarp();
#pragma unroll 8
    for (int t = lane; t < n; t += GLN_WARP) {  // the loads do not wait for each other
        atomicAdd(&next[column[static_cast<long long>(t) * neurons] & (num_contexts - 1)], 1);
    }
    __syncwarp();
    int* row_counts = counts + static_cast<long long>(neuron) * num_contexts;
    int* row_starts = starts + static_cast<long long>(neuron) * num_contexts;
    if (lane == 0) {
        int start = 0;
        for (int c = 0; c < num_contexts; ++c) {
            const int count = next[c];
            row_counts[c] = count;
            row_starts[c] = start;
            next[c] = start;
            start += count;
        }
    }
    __syncwarp();
    int* mine = examples + static_cast<long long>(neuron) * n;
    const auto context_at = [&](int t) {  // -1 past the chunk's end
        return t < n ? column[static_cast<long long>(t) * neurons] & (num_contexts - 1) : -1;
    };
    int ahead = context_at(lane);  // each window's contexts are loaded a window ahead
    for (int first = 0; first < n; first += GLN_WARP) {
        const int t = first + lane;
        const int c = ahead;
        ahead = context_at(t + GLN_WARP);
        const unsigned same = __match_any_sync(GLN_FULL_MASK, c);
        const int place = c < 0 ? 0 : next[c] + __popc(same & ((1u << lane) - 1u));
        __syncwarp();  // every lane has read its context's next place
        if (c >= 0) {
            mine[place] = t;
            if (lane == __ffs(static_cast<int>(same)) - 1) next[c] += __popc(same);
        }
        __syncwarp();
    }
}

#define GLN_ORDER_BUCKETS 64
#define GLN_ORDER_THREADS 256

// A row's place among GLN_ORDER_BUCKETS buckets of counts, the largest counts first.
__device__ __forceinline__ int order_bucket(int count, int n) {
    return GLN_ORDER_BUCKETS - 1 -
           static_cast<int>(static_cast<long long>(count) * GLN_ORDER_BUCKETS / (n + 1));
}

// The order in which gln_layer_pass_rows takes the rows: those with the most examples first, so
// that the longest chains start at once and the short ones fill in around them, instead of
// one starting behind thousands of others. By buckets of counts (a counting sort); within a
// bucket in any order, which changes no result: rows are independent. One block; the bucket
// starts in GLN_ORDER_BUCKETS ints of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(GLN_ORDER_THREADS)
gln_row_order(const int* __restrict__ counts, int rows, int n, int* __restrict__ order) {
    int* next = reinterpret_cast<int*>(dynamic_shared_floats());  // then each bucket's next place
    for (int b = threadIdx.x; b < GLN_ORDER_BUCKETS; b += blockDim.x) next[b] = 0;
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        atomicAdd(&next[order_bucket(counts[r], n)], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int start = 0;
        for (int b = 0; b < GLN_ORDER_BUCKETS; ++b) {
            const int size = next[b];
            next[b] = start;
            start += size;
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        order[atomicAdd(&next[order_bucket(counts[r], n)], 1)] = r;
    }
}

// The contexts of a shared-prediction block's neurons at example t: lane l holds neuron
// neuron0 + l's (a block has at most 32 neurons), lanes beyond the block's count hold 0.
__device__ __forceinline__ int block_context(const int* contexts, int t, long long per_example,
                                             long long neuron0, int lane, int count,
                                             int num_contexts) {
    return lane < count ? contexts[t * per_example + neuron0 + lane] & (num_contexts - 1) : 0;
}

// Lane `count` of the warp keeps the next finished dot product with its neuron (j of the
// block) and example: once every lane holds one, the sigmoid, clipping and outputs of 32
// (neuron, example) pairs run at once, a lane each, instead of a whole warp's worth of them
// per pair.
struct HeldDots {
    int count, j, t;
    float dot;
};

// Example t of a shared-prediction warp on wide rows: its dot product with each of the block's
// `count` neurons, one butterfly each, held until 32 are finished. With GLN_PREFETCH the next
// example's input (t + warps) goes into `x_next` first, other registers, and the caller swaps
// the two inputs' roles from one example to the next, so nothing is copied between them;
// without it they are the same registers, loaded after the mixing.
__device__ __forceinline__ void predict_example(float (&x)[GLN_PER_LANE],
                                                float (&x_next)[GLN_PER_LANE],
                                                float (&w)[GLN_PER_LANE], const float* rows,
                                                const LayerArgs& a, const int* contexts,
                                                const float* input0, long long input_stride,
                                                long long per_example, long long neuron0, int g,
                                                int count, int t, int warps, int end, int lane,
                                                HeldDots& held) {
    const int I = a.num_inputs;
    const int mine =
        block_context(contexts, t, per_example, neuron0, lane, count, a.num_contexts);
#if GLN_PREFETCH
    if (t + warps < end) load_input(x_next, input0 + (t + warps) * input_stride, lane, I);
#endif
    for (int j = 0; j < count; ++j) {
        const int c = __shfl_sync(GLN_FULL_MASK, mine, j);
        load_row(w, rows + (j * static_cast<long long>(a.num_contexts) + c) * I, lane, I);
        const float dot = warp_dot(w, x);
        if (lane == held.count) {
            held.dot = dot;
            held.j = j;
            held.t = t;
        }
        if (++held.count == GLN_WARP) {
            write_outputs(a, neuron0 + held.j, g, held.t, squash(held.dot, a.lo, a.hi));
            held.count = 0;
        }
    }
#if !GLN_PREFETCH
    if (t + warps < end) load_input(x_next, input0 + (t + warps) * input_stride, lane, I);
#endif
}

// Prediction only. Block (blockIdx.x, blockIdx.y) holds neurons k0 .. k0 + neurons_per_block - 1
// of GLN g (blockIdx.x = g * blocks_per_gln + k0 / neurons_per_block) and examples
// [blockIdx.y * rows_per_warp, ...) of at most rows_per_warp examples (here: per block); warp w
// of the block takes the examples w, w + warps, ... of that range. Each (neuron, example) is
// mixed by mix_and_learn exactly as the other kernels mix it, so the bytes are theirs.
extern "C" __global__ void __launch_bounds__(GLN_WARP * GLN_PREDICT_WARPS, 1)
gln_layer_predict_shared(GLN_LAYER_KERNEL_PARAMETERS) {
    (void)learn;  // never learns: the host launches it for prediction only
    const int lane = threadIdx.x % GLN_WARP, warp = threadIdx.x / GLN_WARP;
    const int warps = blockDim.x / GLN_WARP;
    const int blocks_per_gln = (num_neurons + neurons_per_block - 1) / neurons_per_block;
    const int g = blockIdx.x / blocks_per_gln;
    const int k0 = (blockIdx.x % blocks_per_gln) * neurons_per_block;
    const long long first = static_cast<long long>(blockIdx.y) * rows_per_warp;
    if (g >= num_glns || first >= n) return;  // whole block
    const int count = num_neurons - k0 < neurons_per_block ? num_neurons - k0 : neurons_per_block;
    const int begin = static_cast<int>(first);
    const int end = n - begin < rows_per_warp ? n : begin + rows_per_warp;
    const LayerArgs a = layer_args(contexts, inputs, targets, rates, probs, next_inputs, n,
                                   num_glns, num_neurons, num_contexts, num_inputs, input_groups,
                                   lo, hi, bound, 0, bias_logit, write_next);
    const int I = num_inputs;
    const long long row_floats = static_cast<long long>(num_contexts) * I;
    const long long neuron0 = static_cast<long long>(g) * num_neurons + k0;
    float* rows = dynamic_shared_floats();
    rows_to_shared(rows, weights + neuron0 * row_floats, count * row_floats, threadIdx.x,
                   blockDim.x);
    __syncthreads();

    const int source = input_groups == 1 ? 0 : g;
    const long long input_stride = static_cast<long long>(input_groups) * I;
    const float* input0 = inputs + static_cast<long long>(source) * I;
    const long long per_example = static_cast<long long>(num_glns) * num_neurons;
    float w[GLN_PER_LANE];  // a row (the group's inputs are their own, below)
#if GLN_SUM_BATCH == 1
    float x[GLN_PER_LANE];
    HeldDots held = {0, 0, 0, 0.0f};
    int t = begin + warp;
    if (t < end) load_input(x, input0 + t * input_stride, lane, I);
#if GLN_PREFETCH
    float x_next[GLN_PER_LANE];
    for (; t < end; t += 2 * warps) {  // the two inputs' roles alternate
        predict_example(x, x_next, w, rows, a, contexts, input0, input_stride, per_example,
                        neuron0, g, count, t, warps, end, lane, held);
        if (t + warps < end) {
            predict_example(x_next, x, w, rows, a, contexts, input0, input_stride, per_example,
                            neuron0, g, count, t + warps, warps, end, lane, held);
        }
    }
#else
    for (; t < end; t += warps) {
        predict_example(x, x, w, rows, a, contexts, input0, input_stride, per_example, neuron0,
                        g, count, t, warps, end, lane, held);
    }
#endif
    if (lane < held.count) {
        write_outputs(a, neuron0 + held.j, g, held.t, squash(held.dot, lo, hi));
    }
#elif GLN_EXAMPLE_GROUP > 1
    // The warp's examples GLN_EXAMPLE_GROUP at a time (t0, t0 + warps, ...: its turns, as
    // above), their inputs in registers together, and the block's neurons kNeurons at a time:
    // a batch is every pair of kNeurons neurons and the group's examples, pair (jj, e) at
    // part[jj * GLN_EXAMPLE_GROUP + e], so where each pair's sum lands is known before it is
    // made: no pair checks whether its example has ended, and no lane picks its pair out.
    // Pairs past the block's neurons or the warp's examples are mixed from zeros or not at
    // all, and never written.
    static_assert(GLN_SUM_BATCH % GLN_EXAMPLE_GROUP == 0, "a batch holds whole groups");
    constexpr int kNeurons = GLN_SUM_BATCH / GLN_EXAMPLE_GROUP;
    constexpr int kLanesPerSum = GLN_WARP / GLN_SUM_BATCH;
    float xs[GLN_EXAMPLE_GROUP][GLN_PER_LANE];
    int mine[GLN_EXAMPLE_GROUP];
    for (int t0 = begin + warp; t0 < end; t0 += GLN_EXAMPLE_GROUP * warps) {
#pragma unroll
        for (int e = 0; e < GLN_EXAMPLE_GROUP; ++e) {
            const int t = t0 + e * warps;
            if (t < end) {
                load_input(xs[e], input0 + t * input_stride, lane, I);
                mine[e] =
                    block_context(contexts, t, per_example, neuron0, lane, count, num_contexts);
            } else {
#pragma unroll
                for (int i = 0; i < GLN_PER_LANE; ++i) xs[e][i] = 0.0f;
                mine[e] = 0;
            }
        }
        for (int j0 = 0; j0 < count; j0 += kNeurons) {
            float part[GLN_SUM_BATCH];
#pragma unroll
            for (int jj = 0; jj < kNeurons; ++jj) {
                const int j = j0 + jj;  // the same on every lane
#pragma unroll
                for (int e = 0; e < GLN_EXAMPLE_GROUP; ++e) {
                    part[jj * GLN_EXAMPLE_GROUP + e] = 0.0f;
                    if (j >= count) continue;
                    const int c = __shfl_sync(GLN_FULL_MASK, mine[e], j);
                    load_row(w, rows + (j * static_cast<long long>(num_contexts) + c) * I, lane, I);
                    part[jj * GLN_EXAMPLE_GROUP + e] = lane_dot(w, xs[e]);
                }
            }
            const float dot = batched_warp_sums(part, lane);
            const int pair = lane / kLanesPerSum;
            const int j = j0 + pair / GLN_EXAMPLE_GROUP;
            const int t = t0 + pair % GLN_EXAMPLE_GROUP * warps;
            if (lane % kLanesPerSum == 0 && j < count && t < end) {
                write_outputs(a, neuron0 + j, g, t, squash(dot, lo, hi));
            }
        }
    }
#else
    float x[GLN_PER_LANE];
#if GLN_PREFETCH
    float x_next[GLN_PER_LANE];
#endif
    // The warp's (neuron, example) pairs, neuron by neuron within an example: j of example t.
    // GLN_SUM_BATCH of them are mixed, then summed together (batched_warp_sums), and the lane
    // left with a pair's sum squashes it and writes its outputs, so a pair costs the warp its
    // products and a share of one reduction, not a butterfly and a squash of its own.
    int t = begin + warp, j = 0, mine = 0;
    if (t < end) {
        load_input(x, input0 + t * input_stride, lane, I);
        mine = block_context(contexts, t, per_example, neuron0, lane, count, num_contexts);
#if GLN_PREFETCH
        if (t + warps < end) load_input(x_next, input0 + (t + warps) * input_stride, lane, I);
#endif
    }
    constexpr int kLanesPerSum = GLN_WARP / GLN_SUM_BATCH;
    while (t < end) {  // t is the same on every lane: the warp stays together
        float part[GLN_SUM_BATCH];
        int my_j = -1;  // this lane's pair: neuron j of the block, of example my_t
        int my_t = 0;
#pragma unroll
        for (int b = 0; b < GLN_SUM_BATCH; ++b) {
            part[b] = 0.0f;
            if (t >= end) continue;
            const int c = __shfl_sync(GLN_FULL_MASK, mine, j);
            load_row(w, rows + (j * static_cast<long long>(num_contexts) + c) * I, lane, I);
            part[b] = lane_dot(w, x);
            if (lane / kLanesPerSum == b) {
                my_j = j;
                my_t = t;
            }
            if (++j < count) continue;
            j = 0;  // the next example
            t += warps;
            if (t >= end) continue;
#if GLN_PREFETCH
#pragma unroll
            for (int i = 0; i < GLN_PER_LANE; ++i) x[i] = x_next[i];
            if (t + warps < end) load_input(x_next, input0 + (t + warps) * input_stride, lane, I);
#else
            load_input(x, input0 + t * input_stride, lane, I);
#endif
            mine = block_context(contexts, t, per_example, neuron0, lane, count, num_contexts);
        }
        const float dot = batched_warp_sums(part, lane);
        if (my_j >= 0 && lane % kLanesPerSum == 0) {
            write_outputs(a, neuron0 + my_j, g, my_t, squash(dot, lo, hi));
        }
    }
#endif  // GLN_SUM_BATCH
}
