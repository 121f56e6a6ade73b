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
// float32 margin's (*pending_count is zeroed by the bounds' kernel before this one). A list
// already full, and pending_capacity == 0 (chunks of a few rows, whose few margins a second
// launch would cost more than it saves), re-check in place. `Products`
// gives the float32 product of row t and plane p: the GEMM's (Float32Products), or the int8
// slices' estimate, made here from the orders' sums (Int8Products).
template <typename Products>
__device__ __forceinline__ void halfspace_contexts(
    const Products& products, const float* __restrict__ z, const float* __restrict__ normals,
    const float* __restrict__ offsets, const float* __restrict__ tolerance, int n, int neurons,
    int context_dim, int num_features, const int* __restrict__ layer_starts, int layers,
    int* __restrict__ contexts, long long* __restrict__ pending, int pending_capacity,
    int* __restrict__ pending_count) {
    const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (at >= static_cast<long long>(n) * neurons) return;
    const long long t = at / neurons;
    const long long k = at - t * neurons;
    const long long planes = static_cast<long long>(neurons) * context_dim;
    const float margin_bound = tolerance[t];
    int context = 0;
    for (int j = 0; j < context_dim; ++j) {
        const long long p = k * context_dim + j;
        const float margin = __fsub_rn(products.product(t, p, planes), offsets[p]);
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

struct Float32Products {
    const float* __restrict__ products;  // (n, planes)
    __device__ __forceinline__ float product(long long t, long long p, long long planes) const {
        return products[t * planes + p];
    }
};

extern "C" __global__ void __launch_bounds__(128)
gln_halfspace_contexts(const float* __restrict__ products, const float* __restrict__ z,
                       const float* __restrict__ normals, const float* __restrict__ offsets,
                       const float* __restrict__ tolerance, int n, int neurons, int context_dim,
                       int num_features, const int* __restrict__ layer_starts, int layers,
                       int* __restrict__ contexts, long long* __restrict__ pending,
                       int pending_capacity, int* __restrict__ pending_count) {
    halfspace_contexts(Float32Products{products}, z, normals, offsets, tolerance, n, neurons,
                       context_dim, num_features, layer_starts, layers, contexts, pending,
                       pending_capacity, pending_count);
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

// A chunk's count of listed margins, zeroed by the kernel that makes the rows' bounds, which
// runs before gln_halfspace_contexts counts in it: a launch (a memset) fewer a chunk, and a
// chunk's device work stays kernels and the GEMM, which a CUDA graph captures. Null: nothing
// to zero.
__device__ __forceinline__ void zero_pending_count(int* pending_count) {
    if (pending_count != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *pending_count = 0;
}

// The rounding bound of each row, as gln.gating.rounding_tolerances computes it:
//   tolerance[t] = 2 gamma_d ||z_t||_2 + 1e-30, rounded to float32,
// one warp per row (lanes take every 32nd feature, then a butterfly sum), instead of the
// seven launches the array code takes. The sum's order differs from CuPy's; any valid bound
// gives the same decisions, since margins beyond it have the exact sign either way. Zeroes
// `pending_count` (may be null) for the contexts kernel after it.
extern "C" __global__ void __launch_bounds__(128)
gln_rounding_tolerances(const float* __restrict__ z, int n, int num_features, double twice_gamma,
                        float* __restrict__ tolerance, int* __restrict__ pending_count) {
    zero_pending_count(pending_count);
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

// ------------------------------------------------------------------------------------------
// The gating products from int8 slices (gln.kernels.cuda.GATING_PRODUCT = "int8"). Integer
// tensor cores add in int32 exactly, so a product of int8 slices errs only by the slicing, and
// that error is bounded here per row: the products' estimate (as float32, made by
// gln_int8_contexts as it reads each product) and that bound stand in for the float32 GEMM and
// gln_rounding_tolerances, and every margin outside the bound has the exact sign, as with the
// float32 products. Each row of z and each normal is scaled by the least power of two s with
// max |x| <= 127 s and cut into GLN_INT8_SLICES slices of integers:
//   x / s = A_0 + A_1 / 128 + ... + A_{K-1} / 128^(K-1) + R / 128^(K-1),   |R| <= 1/2,
// A_0 in [-127, 127], the others in [-64, 64]. cuBLAS sums A_i . B_j for each order i + j < K
// in int32, one GEMM an order (at most 3 * 127^2 * d: no overflow below d = 44,000); the pairs
// of higher order and the remainders are bounded by Cauchy-Schwarz on the slices' norms and by
// their L1 norms.
#define GLN_INT8_SLICES 3
#define GLN_INT8_BASE 128.0

// Rows of x (rows, d) cut into slices, side by side in (rows, K * stride): slice k of a row in
// columns k * stride onwards, or, `reversed` (the planes), (K - 1 - k) * stride onwards, so that
// the first (o + 1) * stride columns of the rows and the last of the planes pair the slices of
// order o (A_0 B_o + ... + A_o B_0) in one GEMM; zeros from column d to stride (a multiple of
// 16: cuBLAS's int8 GEMMs take lengths that are multiples of 4, and operands 16-byte aligned
// for its fastest kernels). With each row's scale, each slice's Euclidean norm (K,
// rows), the L1 norm of the slices' weighted sum, and ||x||_2. One warp per row.
extern "C" __global__ void __launch_bounds__(128)
gln_int8_slices(const float* __restrict__ x, int rows, int d, int stride, int reversed,
                signed char* __restrict__ slices, double* __restrict__ scale,
                double* __restrict__ norms, double* __restrict__ kept_l1,
                double* __restrict__ length) {
    const long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (t >= rows) return;  // whole warps: the block size is a multiple of 32
    const float* __restrict__ row = x + t * d;
    double largest = 0.0;
    for (int i = lane; i < d; i += 32) largest = fmax(largest, fabs(static_cast<double>(row[i])));
    for (int offset = 16; offset > 0; offset >>= 1) {
        largest = fmax(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
    }
    double s = 1.0;  // a row of zeros keeps 1
    if (largest > 0.0) {
        int exponent = 0;
        frexp(largest / 127.0, &exponent);  // a guess, within a factor of two
        s = ldexp(1.0, exponent);
        while (largest > 127.0 * s) s *= 2.0;  // exact comparisons from here
        while (largest <= 63.5 * s) s *= 0.5;
    }
    double squares[GLN_INT8_SLICES] = {}, l1 = 0.0, sum_sq = 0.0;
    for (int i = lane; i < stride; i += 32) {
        const double value = i < d ? static_cast<double>(row[i]) : 0.0;
        sum_sq = __dadd_rn(sum_sq, __dmul_rn(value, value));
        double rest = value / s, kept = 0.0, unit = 1.0;  // exact: s is a power of two
        for (int k = 0; k < GLN_INT8_SLICES; ++k) {
            const double part = rint(rest);
            const int column = (reversed ? GLN_INT8_SLICES - 1 - k : k) * stride + i;
            slices[t * GLN_INT8_SLICES * stride + column] = static_cast<signed char>(part);
            squares[k] += part * part;  // integers far below 2^53: exact
            kept += part * unit;        // exact: 24 bits at most
            rest = (rest - part) * GLN_INT8_BASE;
            unit /= GLN_INT8_BASE;
        }
        l1 += fabs(kept);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        for (int k = 0; k < GLN_INT8_SLICES; ++k) {
            squares[k] += __shfl_xor_sync(0xffffffffu, squares[k], offset);
        }
        l1 += __shfl_xor_sync(0xffffffffu, l1, offset);
        sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
    }
    if (lane == 0) {
        scale[t] = s;
        for (int k = 0; k < GLN_INT8_SLICES; ++k) norms[k * rows + t] = sqrt(squares[k]);
        kept_l1[t] = l1;
        length[t] = sqrt(sum_sq);
    }
}

// The planes' largest factors, for the rows' tolerance: terms[j] = max_p s_p |B_j,p| (j < K),
// terms[K] = max_p s_p, terms[K + 1] = max_p s_p |kept_p|_1, terms[K + 2] = max_p |offset_p|,
// as partial maxima, one set of K + 3 per warp of the grid (warps take every W-th plane, W the
// grid's warps), which gln_int8_row_tolerances takes the maxima of (maxima are exact in any
// order). A single warp over every plane waited on memory for each of its hundreds of turns.
extern "C" __global__ void __launch_bounds__(128)
gln_int8_plane_terms(const double* __restrict__ scale, const double* __restrict__ norms,
                     const double* __restrict__ kept_l1, const float* __restrict__ offsets,
                     int planes, double* __restrict__ partial_terms) {
    const int lane = threadIdx.x & 31;
    const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
    const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
    double most[GLN_INT8_SLICES + 3] = {};
    for (int p = warp * 32 + lane; p < planes; p += warps * 32) {
        for (int j = 0; j < GLN_INT8_SLICES; ++j) {
            most[j] = fmax(most[j], scale[p] * norms[j * planes + p]);
        }
        most[GLN_INT8_SLICES] = fmax(most[GLN_INT8_SLICES], scale[p]);
        most[GLN_INT8_SLICES + 1] = fmax(most[GLN_INT8_SLICES + 1], scale[p] * kept_l1[p]);
        most[GLN_INT8_SLICES + 2] =
            fmax(most[GLN_INT8_SLICES + 2], fabs(static_cast<double>(offsets[p])));
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        for (int j = 0; j < GLN_INT8_SLICES + 3; ++j) {
            most[j] = fmax(most[j], __shfl_xor_sync(0xffffffffu, most[j], offset));
        }
    }
    if (lane == 0) {
        for (int j = 0; j < GLN_INT8_SLICES + 3; ++j) {
            partial_terms[warp * (GLN_INT8_SLICES + 3) + j] = most[j];
        }
    }
}

// Each row's tolerance for the int8 estimate's float32 margins, rounded up to float32: the
// dropped slice pairs, the remainders and the float64 sum of the estimate, over every plane
// (its largest factors, the maxima of gln_int8_plane_terms's partials), then the estimate's
// rounding to float32 and the kernel's float32 subtraction of the offset, 2^-24 of each size
// (|estimate| <= ||z|| ||v|| + bound, ||v|| = 1 up to float32's rounding of the unit
// normals). The products of scales and norms round by 2^-53 each, which the 2^-40 margin
// covers. Zeroes `pending_count` (may be null), as gln_rounding_tolerances does.
extern "C" __global__ void __launch_bounds__(128)
gln_int8_row_tolerances(const double* __restrict__ scale, const double* __restrict__ norms,
                        const double* __restrict__ kept_l1, const double* __restrict__ length,
                        const double* __restrict__ partial_terms, int partials, int rows, int d,
                        float* __restrict__ tolerance, int* __restrict__ pending_count) {
    zero_pending_count(pending_count);
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= rows) return;
    double terms[GLN_INT8_SLICES + 3] = {};
    for (int i = 0; i < partials; ++i) {
#pragma unroll
        for (int j = 0; j < GLN_INT8_SLICES + 3; ++j) {
            terms[j] = fmax(terms[j], partial_terms[i * (GLN_INT8_SLICES + 3) + j]);
        }
    }
    double dropped = 0.0, sizes = 0.0, weight_i = 1.0;
    for (int i = 0; i < GLN_INT8_SLICES; ++i, weight_i /= GLN_INT8_BASE) {
        double weight = weight_i;
        for (int j = 0; j < GLN_INT8_SLICES; ++j, weight /= GLN_INT8_BASE) {
            const double term = norms[i * rows + t] * terms[j] * weight;
            if (i + j >= GLN_INT8_SLICES) {
                dropped += term;
            } else {
                sizes += term;
            }
        }
    }
    double last = 0.5;
    for (int k = 1; k < GLN_INT8_SLICES; ++k) last /= GLN_INT8_BASE;
    const double remainders = last * (kept_l1[t] * terms[GLN_INT8_SLICES] +
                                      terms[GLN_INT8_SLICES + 1]) +
                              d * last * last * terms[GLN_INT8_SLICES];
    const double bound =
        ((dropped + remainders) * (1.0 + ldexp(1.0, -40)) + ldexp(sizes, -50)) * scale[t];
    const double estimate = 1.001 * length[t] + bound;
    const double total =
        (bound + ldexp(estimate + terms[GLN_INT8_SLICES + 2], -23)) * 1.001;
    float rounded = static_cast<float>(total);
    if (static_cast<double>(rounded) < total) rounded = nextafterf(rounded, 3.0e38f);
    tolerance[t] = rounded;
}

// The estimate of z_t . v_p from the three orders' int32 sums, as float32:
// ((o0 + o1 / 128) + o2 / 128^2) s_t s_p, the scales powers of two.
__device__ __forceinline__ float int8_estimate(int order0, int order1, int order2,
                                               double row_scale, double plane_scale) {
    const double sum = __dadd_rn(
        __dadd_rn(static_cast<double>(order0), static_cast<double>(order1) / 128.0),
        static_cast<double>(order2) / 16384.0);
    return __double2float_rn(__dmul_rn(__dmul_rn(sum, row_scale), plane_scale));
}

struct Int8Products {
    const int* __restrict__ order0;  // (n, planes) each
    const int* __restrict__ order1;
    const int* __restrict__ order2;
    const double* __restrict__ row_scale;
    const double* __restrict__ plane_scale;
    __device__ __forceinline__ float product(long long t, long long p, long long planes) const {
        const long long at = t * planes + p;
        return int8_estimate(order0[at], order1[at], order2[at], row_scale[t], plane_scale[p]);
    }
};

// gln_halfspace_contexts on the int8 slices' orders, each estimate made where it is read: the
// float32 estimates are never written out and read back (for MNIST, 84 MB each way a 2,048-row
// chunk).
extern "C" __global__ void __launch_bounds__(128)
gln_int8_contexts(const int* __restrict__ order0, const int* __restrict__ order1,
                  const int* __restrict__ order2, const double* __restrict__ row_scale,
                  const double* __restrict__ plane_scale, const float* __restrict__ z,
                  const float* __restrict__ normals, const float* __restrict__ offsets,
                  const float* __restrict__ tolerance, int n, int neurons, int context_dim,
                  int num_features, const int* __restrict__ layer_starts, int layers,
                  int* __restrict__ contexts, long long* __restrict__ pending,
                  int pending_capacity, int* __restrict__ pending_count) {
    halfspace_contexts(Int8Products{order0, order1, order2, row_scale, plane_scale}, z, normals,
                       offsets, tolerance, n, neurons, context_dim, num_features, layer_starts,
                       layers, contexts, pending, pending_capacity, pending_count);
}

// Every estimate at once, (rows, planes) float32, the values gln_int8_contexts reads: for
// checks of the bound and benchmarks, not the library's gating.
extern "C" __global__ void __launch_bounds__(128)
gln_int8_estimates(const int* __restrict__ order0, const int* __restrict__ order1,
                   const int* __restrict__ order2, const double* __restrict__ row_scale,
                   const double* __restrict__ plane_scale, int rows, int planes,
                   float* __restrict__ products) {
    const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (at >= static_cast<long long>(rows) * planes) return;
    const long long t = at / planes;
    products[at] = Int8Products{order0, order1, order2, row_scale, plane_scale}.product(
        t, at - t * planes, planes);
}
