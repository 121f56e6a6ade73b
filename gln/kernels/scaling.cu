// Online input scaling of a chunk in one launch each: gln.scaling.scale_inputs, both modes,
// and the per-row side information that may replace z. Each kernel has two entry points,
// `name` for float64 rows and `name_f32` for float32 rows (a long chunk's, as they were sent),
// each value read as the float64 it equals: the same arithmetic on the same values, the bits
// of the widened rows.
//
// Mode "standardize".
//
// In plain CuPy that is a dozen elementwise launches per chunk, which dominate the time of a
// single-example learn. One thread here owns one feature of one row and does the same float64
// arithmetic in the same order with explicitly rounded operations (IEEE division and square
// root are correctly rounded, and no fused multiply-add is allowed), so the results equal
// NumPy's bit for bit:
//   mean     = count > 0 ? sum / max(count, 1) : 0
//   variance = count > 0 ? max(sum_sq / max(count, 1) - mean * mean, 0) : 1
//   z        = count > 0 ? clip((x - shift - mean) / max(sqrt(variance), min_std), +-GLN_Z_LIMIT)
//                        : 0 (nothing learned yet: no scale to judge a value by)
//   logit    = clip(z, -logit_cap, logit_cap)
// both rounded to float32. The statistics are those before each row (stats_rows = n, learning)
// or one frozen set for every row (stats_rows = 1, prediction), of x - shift (gln.scaling says
// why the running sums are shifted).

// GLN_Z_LIMIT (gln.scaling.Z_LIMIT, passed by gln.kernels.cuda) bounds z before it becomes
// float32, where an outlier would otherwise be infinite.
#ifndef GLN_Z_LIMIT
#error "compile with -DGLN_Z_LIMIT=<gln.scaling.Z_LIMIT>"
#endif

__device__ __forceinline__ float gln_bounded_z(double value) {
    const double bounded = value < -GLN_Z_LIMIT ? -GLN_Z_LIMIT
                         : (value > GLN_Z_LIMIT ? GLN_Z_LIMIT : value);
    return __double2float_rn(bounded);
}

// The row kernels (unit scaling, per-row side information) give one warp a row: lanes take every
// 32nd element, then this fixed butterfly, so a row's sums never depend on its chunk.
#define GLN_ROW_LANES 32

__device__ __forceinline__ double gln_warp_sum(double v) {
    for (int offset = GLN_ROW_LANES / 2; offset > 0; offset >>= 1) {
        v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;  // the same bits on every lane: IEEE addition is commutative
}

// Mean and (population) variance from a feature's running sums; 0 and 1 before any row.
__device__ __forceinline__ void gln_mean_and_variance(double count, double sum, double sum_sq,
                                                      double* mean, double* variance) {
    *mean = 0.0;
    *variance = 1.0;
    if (count > 0.0) {
        const double safe_count = count > 1.0 ? count : 1.0;
        *mean = __ddiv_rn(sum, safe_count);
        const double spread = __dsub_rn(__ddiv_rn(sum_sq, safe_count), __dmul_rn(*mean, *mean));
        *variance = spread >= 0.0 ? spread : 0.0;  // as NumPy's maximum(spread, 0)
    }
}

template <typename Row>
__device__ __forceinline__ void standardize(
        const Row* __restrict__ x, const double* __restrict__ shift,
        const double* __restrict__ counts, const double* __restrict__ sums,
        const double* __restrict__ sums_sq, int n, int num_features, int stats_rows,
        double min_std, double logit_cap, float* __restrict__ z,
        float* __restrict__ base_logits) {
    const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (at >= static_cast<long long>(n) * num_features) return;
    const long long t = at / num_features;
    const long long f = at - t * num_features;
    const long long row = stats_rows == 1 ? 0 : t;
    const long long stat = row * num_features + f;
    double mean, variance;
    gln_mean_and_variance(counts[row], sums[stat], sums_sq[stat], &mean, &variance);
    const double root = __dsqrt_rn(variance);
    const double scale = root >= min_std ? root : min_std;
    const double value = counts[row] > 0.0
        ? __ddiv_rn(__dsub_rn(__dsub_rn(static_cast<double>(x[at]), shift[f]), mean), scale)
        : 0.0;
    const double logit = value < -logit_cap ? -logit_cap : (value > logit_cap ? logit_cap : value);
    z[at] = gln_bounded_z(value);
    base_logits[at] = __double2float_rn(logit);
}

#define GLN_STANDARDIZE_PARAMETERS                                                          \
    const double *__restrict__ shift, const double *__restrict__ counts,                  \
        const double *__restrict__ sums, const double *__restrict__ sums_sq, int n,        \
        int num_features, int stats_rows, double min_std, double logit_cap,               \
        float *__restrict__ z, float *__restrict__ base_logits
#define GLN_STANDARDIZE_ARGUMENTS \
    shift, counts, sums, sums_sq, n, num_features, stats_rows, min_std, logit_cap, z, base_logits

extern "C" __global__ void __launch_bounds__(128)
gln_standardize(const double* __restrict__ x, GLN_STANDARDIZE_PARAMETERS) {
    standardize(x, GLN_STANDARDIZE_ARGUMENTS);
}

extern "C" __global__ void __launch_bounds__(128)
gln_standardize_f32(const float* __restrict__ x, GLN_STANDARDIZE_PARAMETERS) {
    standardize(x, GLN_STANDARDIZE_ARGUMENTS);
}

// Mode "unit" in one launch (inputs already probabilities, such as pixels): in CuPy about twenty
// elementwise launches per chunk. One warp owns one row, since z divides by one pooled standard
// deviation per row, the root mean of the per-feature variances:
//   z     = (x - mean) / max(sqrt(sum_j variance_j / d), min_std), bounded as above
//           (only when want_z)
//   logit = log(p) - log1p(-p) = log(p / (1 - p)),  p = clip(x, pred_clip, 1 - pred_clip)
// mean and variance as in gln_standardize. The sum over features has a fixed order (lanes take
// every 32nd feature, then a butterfly), so a row's bits never depend on its chunk; they equal
// NumPy's up to the rounding of that sum.

template <typename Row>
__device__ __forceinline__ void unit_scaling(
        const Row* __restrict__ x, const double* __restrict__ counts,
        const double* __restrict__ sums, const double* __restrict__ sums_sq, int n,
        int num_features, int stats_rows, double min_std, double pred_clip, int want_z,
        float* __restrict__ z, float* __restrict__ base_logits) {
    const long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (t >= n) return;  // whole warps: the block size is a multiple of 32
    const int d = num_features;
    const Row* row = x + t * d;
    const long long stats = (stats_rows == 1 ? 0 : t) * static_cast<long long>(d);
    const double count = counts[stats_rows == 1 ? 0 : t];
    const double hi = __dsub_rn(1.0, pred_clip);
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        const double v = static_cast<double>(row[i]);
        const double p = v < pred_clip ? pred_clip : (v > hi ? hi : v);
        // log(p / (1 - p)) as NumPy writes it; this form is as accurate and, unlike a log of
        // the quotient, compiles without a register spill.
        base_logits[t * d + i] = __double2float_rn(__dsub_rn(log(p), log1p(-p)));
    }
    if (!want_z) return;  // the whole warp: want_z is the same for every thread
    double total = 0.0;
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        double mean, variance;
        gln_mean_and_variance(count, sums[stats + i], sums_sq[stats + i], &mean, &variance);
        total = __dadd_rn(total, variance);
    }
    const double pooled = __dsqrt_rn(__ddiv_rn(gln_warp_sum(total), static_cast<double>(d)));
    const double scale = pooled >= min_std ? pooled : min_std;
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        double mean, variance;
        gln_mean_and_variance(count, sums[stats + i], sums_sq[stats + i], &mean, &variance);
        const double value = static_cast<double>(row[i]);
        z[t * d + i] = gln_bounded_z(__ddiv_rn(__dsub_rn(value, mean), scale));
    }
}

#define GLN_UNIT_PARAMETERS                                                                   \
    const double *__restrict__ counts, const double *__restrict__ sums,                     \
        const double *__restrict__ sums_sq, int n, int num_features, int stats_rows,         \
        double min_std, double pred_clip, int want_z, float *__restrict__ z,                 \
        float *__restrict__ base_logits
#define GLN_UNIT_ARGUMENTS \
    counts, sums, sums_sq, n, num_features, stats_rows, min_std, pred_clip, want_z, z, base_logits

extern "C" __global__ void __launch_bounds__(128)
gln_unit_scaling(const double* __restrict__ x, GLN_UNIT_PARAMETERS) {
    unit_scaling(x, GLN_UNIT_ARGUMENTS);
}

extern "C" __global__ void __launch_bounds__(128)
gln_unit_scaling_f32(const float* __restrict__ x, GLN_UNIT_PARAMETERS) {
    unit_scaling(x, GLN_UNIT_ARGUMENTS);
}

// Per-row side information (side_info="per_row") in one launch: gln.scaling.per_row_side_info.
//
// Each row centred on its own mean, optionally blurred (B_rows Z B_cols^T for an image Z of
// height x width, the Gaussian matrices of gln.scaling.gaussian_blur_matrix), then rescaled to
// norm sqrt(d); a constant row gives 0. In CuPy that is about fourteen launches, and the blur's
// batched GEMM may round differently for different batch sizes, which would make a chunk differ
// from its rows learned one at a time. Here one warp owns one row and every sum has a fixed
// order (lanes take every 32nd element, then a butterfly), so a row's result never depends on
// the chunk. It equals NumPy's up to the rounding of those sums.

template <typename Row>
__device__ __forceinline__ void per_row_side_info(
        const Row* __restrict__ x, int n, int height, int width, int blurred,
        const double* __restrict__ blur_rows, const double* __restrict__ blur_cols,
        double* __restrict__ scratch, float* __restrict__ z) {
    const long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (t >= n) return;  // whole warps: the block size is a multiple of 32
    const int d = height * width;
    const Row* row = x + t * d;
    double* centred = scratch + t * 2LL * d;  // the centred row, then B_rows times it
    double* smoothed = centred + d;
    double total = 0.0;
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        total = __dadd_rn(total, static_cast<double>(row[i]));
    }
    const double mean = __ddiv_rn(gln_warp_sum(total), static_cast<double>(d));
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        centred[i] = __dsub_rn(static_cast<double>(row[i]), mean);
    }
    const double* out = centred;
    if (blurred) {
        __syncwarp();
        for (int i = lane; i < d; i += GLN_ROW_LANES) {  // (B_rows Z)[r, c]
            const int r = i / width, c = i - r * width;
            double v = 0.0;
            for (int k = 0; k < height; ++k) {
                v = __dadd_rn(v, __dmul_rn(blur_rows[r * height + k], centred[k * width + c]));
            }
            smoothed[i] = v;
        }
        __syncwarp();
        for (int i = lane; i < d; i += GLN_ROW_LANES) {  // (B_rows Z B_cols^T)[r, c]
            const int r = i / width, c = i - r * width;
            double v = 0.0;
            for (int k = 0; k < width; ++k) {
                v = __dadd_rn(v, __dmul_rn(smoothed[r * width + k], blur_cols[c * width + k]));
            }
            centred[i] = v;  // each lane rewrites only elements it alone reads from here on
        }
    }
    double squares = 0.0;
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        squares = __dadd_rn(squares, __dmul_rn(out[i], out[i]));
    }
    const double norm = __dsqrt_rn(gln_warp_sum(squares));
    const double scale = norm > 0.0 ? __ddiv_rn(__dsqrt_rn(static_cast<double>(d)), norm) : 0.0;
    for (int i = lane; i < d; i += GLN_ROW_LANES) {
        z[t * d + i] = __double2float_rn(__dmul_rn(out[i], scale));
    }
}

#define GLN_SIDE_INFO_PARAMETERS                                                            \
    int n, int height, int width, int blurred, const double *__restrict__ blur_rows,      \
        const double *__restrict__ blur_cols, double *__restrict__ scratch,               \
        float *__restrict__ z
#define GLN_SIDE_INFO_ARGUMENTS n, height, width, blurred, blur_rows, blur_cols, scratch, z

extern "C" __global__ void __launch_bounds__(128)
gln_per_row_side_info(const double* __restrict__ x, GLN_SIDE_INFO_PARAMETERS) {
    per_row_side_info(x, GLN_SIDE_INFO_ARGUMENTS);
}

extern "C" __global__ void __launch_bounds__(128)
gln_per_row_side_info_f32(const float* __restrict__ x, GLN_SIDE_INFO_PARAMETERS) {
    per_row_side_info(x, GLN_SIDE_INFO_ARGUMENTS);
}

// Whether a batch sent as float32 rows holds a value that is not finite (or was beyond float32
// before it was rounded): *flag = 1 if so, left as it is otherwise, so that one flag, zeroed
// once, serves every chunk of a call. Prediction reads it with the outputs; the host's check of
// the batch then names the first bad value.
extern "C" __global__ void __launch_bounds__(128)
gln_flag_nonfinite(const float* __restrict__ rows, int n, int num_features,
                   int* __restrict__ flag) {
    const long long size = static_cast<long long>(n) * num_features;
    bool bad = false;
    for (long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
         at < size; at += static_cast<long long>(gridDim.x) * blockDim.x) {
        bad |= !isfinite(rows[at]);
    }
    if (bad) *flag = 1;  // every thread that writes writes the same value
}
