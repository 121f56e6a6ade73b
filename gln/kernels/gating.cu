// Halfspace contexts on the GPU, decided exactly, with no round trip to the host, and the
// per-row rounding bound they need.
//
// gln.gating.halfspace_bits computes every margin z . v_p - b_p in float32 (one GEMM), trusts
// its sign where |margin| exceeds the row's rounding bound, and redoes the rest in float64.
// Finding "the rest" with nonzero() makes the host wait for the GPU on every chunk. Here one
// thread owns one neuron of one row: it takes the neuron's m margins from the GEMM, has the few
// that are too close to call redone in float64 (by itself, or by gln_halfspace_rechecks in a
// second launch), and writes the m-bit context index
//   c = sum_j [z . v_{km+j} >= b_{km+j}] 2^j
// exactly as gln.gating.context_indices folds the bits. The float64 re-check sums the exact
// products (a float32 times a float32 fits a float64) from the first feature to the last, the
// order gln.kernels.cpu uses, with explicitly rounded additions.
//
// Each layer's indices go to a block of their own, (n, G, K_l) in C order, the layout the layer
// pass reads, so no copies split them afterwards. Neuron k of a row is (g, j) = (k / K, k % K)
// with K = layer_starts[layers] neurons per GLN; layer l holds j in
// [layer_starts[l], layer_starts[l + 1]) and its block starts at n G layer_starts[l]. One layer
// of K neurons gives the plain (n, G K) layout.

// The float64 re-check of margin p of row t: the exact products summed from the first feature
// to the last with explicitly rounded additions, as gln.kernels.cpu sums them.
__device__ __forceinline__ bool exactly_above(const float* __restrict__ z,
                                              const float* __restrict__ normals,
                                              const float* __restrict__ offsets, long long t,
                                              long long p, int num_features) {
    double total = 0.0;
    for (int i = 0; i < num_features; ++i) {
        const double zi = static_cast<double>(z[t * num_features + i]);
        const double vi = static_cast<double>(normals[p * num_features + i]);
        total = __dadd_rn(total, __dmul_rn(zi, vi));
    }
    return total >= static_cast<double>(offsets[p]);
}

// Where neuron k's context of row t goes: its layer's block, (n, G, K_l) in C order.
__device__ __forceinline__ long long context_slot(long long t, long long k, int n, int neurons,
                                                  const int* __restrict__ layer_starts,
                                                  int layers) {
    const int per_gln = layer_starts[layers];
    const long long glns = neurons / per_gln;
    const long long g = k / per_gln;
    const int within = static_cast<int>(k - g * per_gln);
    int layer = 0;
    while (within >= layer_starts[layer + 1]) ++layer;
    const long long start = layer_starts[layer];
    const long long width = layer_starts[layer + 1] - start;
    return n * glns * start + (t * glns + g) * width + (within - start);
}

// The margins too close to call are rare (about one in a thousand on standardised inputs),
// but a thread that re-checks one holds its whole warp for the ~800 sequential float64 steps,
// and nearly every warp has one. With pending_capacity > 0 they are listed instead (flat
// index t * planes + p, in pending[0 .. *pending_count)) and gln_halfspace_rechecks settles
// them afterwards, a warp each, with no warp waiting; the bit written here is then the
// float32 margin's. A list already full, and pending_capacity == 0 (a launch that is captured
// into a CUDA graph, which must not need a zeroed counter), re-check in place.
extern "C" __global__ void __launch_bounds__(128)
gln_halfspace_contexts(const float* __restrict__ products, const float* __restrict__ z,
                       const float* __restrict__ normals, const float* __restrict__ offsets,
                       const float* __restrict__ tolerance, int n, int neurons, int context_dim,
                       int num_features, const int* __restrict__ layer_starts, int layers,
                       int* __restrict__ contexts, long long* __restrict__ pending,
                       int pending_capacity, int* __restrict__ pending_count) {
    const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (at >= static_cast<long long>(n) * neurons) return;
    const long long t = at / neurons;
    const long long k = at - t * neurons;
    const long long planes = static_cast<long long>(neurons) * context_dim;
    const float margin_bound = tolerance[t];
    int context = 0;
    for (int j = 0; j < context_dim; ++j) {
        const long long p = k * context_dim + j;
        const float margin = __fsub_rn(products[t * planes + p], offsets[p]);
        bool above = margin >= 0.0f;
        if (fabsf(margin) <= margin_bound) {
            const int slot = pending_capacity > 0 ? atomicAdd(pending_count, 1) : 0;
            if (slot < pending_capacity) {
                pending[slot] = t * planes + p;
            } else {
                above = exactly_above(z, normals, offsets, t, p, num_features);
            }
        }
        context |= static_cast<int>(above) << j;
    }
    contexts[context_slot(t, k, n, neurons, layer_starts, layers)] = context;
}

// The margins gln_halfspace_contexts listed, one warp each (a grid-stride loop: the host does
// not know how many there are): each sets or clears its bit of the context it belongs to. A
// thread of its own per margin read the rows feature by feature, 32 rows apart across the warp
// (about 220 us for 4,096 MNIST rows on an H100). Here the lanes read 32 consecutive features
// of the row and the normal at once and form their exact products, and every lane adds the
// warp's products in feature order, the sum exactly_above makes, so the bit is the one an
// in-place re-check gives.
extern "C" __global__ void __launch_bounds__(128)
gln_halfspace_rechecks(const long long* __restrict__ pending,
                       const int* __restrict__ pending_count, int pending_capacity,
                       const float* __restrict__ z, const float* __restrict__ normals,
                       const float* __restrict__ offsets, int n, int neurons, int context_dim,
                       int num_features, const int* __restrict__ layer_starts, int layers,
                       int* __restrict__ contexts) {
    const int listed = *pending_count < pending_capacity ? *pending_count : pending_capacity;
    const long long planes = static_cast<long long>(neurons) * context_dim;
    const int lane = threadIdx.x & 31;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
         i < listed; i += warps) {  // the same i for the whole warp
        const long long t = pending[i] / planes;
        const long long p = pending[i] - t * planes;
        const float* __restrict__ row = z + t * num_features;
        const float* __restrict__ normal = normals + p * num_features;
        double total = 0.0;
        for (int base = 0; base < num_features; base += 32) {
            const int feature = base + lane;
            const double product =
                feature < num_features
                    ? __dmul_rn(static_cast<double>(row[feature]),
                                static_cast<double>(normal[feature]))
                    : 0.0;
            const int width = num_features - base < 32 ? num_features - base : 32;
            for (int j = 0; j < 32; ++j) {
                const double term = __shfl_sync(0xffffffffu, product, j);
                if (j < width) total = __dadd_rn(total, term);
            }
        }
        if (lane == 0) {
            const long long k = p / context_dim;
            const int bit = 1 << static_cast<int>(p - k * context_dim);
            int* context = contexts + context_slot(t, k, n, neurons, layer_starts, layers);
            if (total >= static_cast<double>(offsets[p])) {
                atomicOr(context, bit);
            } else {
                atomicAnd(context, ~bit);
            }
        }
    }
}

// The rounding bound of each row, as gln.gating.rounding_tolerances computes it:
//   tolerance[t] = 2 gamma_d ||z_t||_2 + 1e-30, rounded to float32,
// one warp per row (lanes take every 32nd feature, then a butterfly sum), instead of the
// seven launches the array code takes. The sum's order differs from CuPy's; any valid bound
// gives the same decisions, since margins beyond it have the exact sign either way.
extern "C" __global__ void __launch_bounds__(128)
gln_rounding_tolerances(const float* __restrict__ z, int n, int num_features, double twice_gamma,
                        float* __restrict__ tolerance) {
    const long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (t >= n) return;  // whole warps: the block size is a multiple of 32
    double total = 0.0;
    for (int i = lane; i < num_features; i += 32) {
        const double v = static_cast<double>(z[t * num_features + i]);
        total = __dadd_rn(total, __dmul_rn(v, v));
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        total = __dadd_rn(total, __shfl_xor_sync(0xffffffffu, total, offset));
    }
    if (lane == 0) {
        const double bound = __dmul_rn(twice_gamma, __dsqrt_rn(total));
        tolerance[t] = __double2float_rn(__dadd_rn(bound, 1e-30));
    }
}

// The float32 margins' products z_t . v_p of a few rows, one warp per (row, plane): lanes take
// every 32nd feature, then a butterfly sum. For a one-row call this stands in for the cuBLAS
// GEMM, whose call costs the host more than the product costs the device. Any order of the
// float32 sum is within the rounding bound that gln_halfspace_contexts allows for.
extern "C" __global__ void __launch_bounds__(128)
gln_halfspace_products(const float* __restrict__ z, const float* __restrict__ normals, int n,
                       int planes, int num_features, float* __restrict__ products) {
    const long long at = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (at >= static_cast<long long>(n) * planes) return;  // whole warps
    const long long t = at / planes;
    const long long p = at - t * planes;
    float total = 0.0f;
    for (int i = lane; i < num_features; i += 32) {
        total = fmaf(z[t * num_features + i], normals[p * num_features + i], total);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        total = __fadd_rn(total, __shfl_xor_sync(0xffffffffu, total, offset));
    }
    if (lane == 0) products[at] = total;
}
