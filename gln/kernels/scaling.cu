// Online standardisation of a chunk in one launch: gln.scaling.scale_inputs, mode "standardize".
//
// In plain CuPy that is a dozen elementwise launches per chunk, which dominate the time of a
// single-example learn. One thread here owns one feature of one row and does the same float64
// arithmetic in the same order with explicitly rounded operations (IEEE division and square
// root are correctly rounded, and no fused multiply-add is allowed), so the results equal
// NumPy's bit for bit:
//   mean     = count > 0 ? sum / max(count, 1) : 0
//   variance = count > 0 ? max(sum_sq / max(count, 1) - mean * mean, 0) : 1
//   z        = (x - mean) / max(sqrt(variance), min_std)
//   logit    = clip(z, -logit_cap, logit_cap)
// both rounded to float32. The statistics are those before each row (stats_rows = n, learning)
// or one frozen set for every row (stats_rows = 1, prediction).

extern "C" __global__ void __launch_bounds__(128)
gln_standardize(const double* __restrict__ x, const double* __restrict__ counts,
                const double* __restrict__ sums, const double* __restrict__ sums_sq,
                int n, int num_features, int stats_rows, double min_std, double logit_cap,
                float* __restrict__ z, float* __restrict__ base_logits) {
    const long long at = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (at >= static_cast<long long>(n) * num_features) return;
    const long long t = at / num_features;
    const long long f = at - t * num_features;
    const long long row = stats_rows == 1 ? 0 : t;
    const double count = counts[row];
    const long long stat = row * num_features + f;
    double mean = 0.0;
    double variance = 1.0;
    if (count > 0.0) {
        const double safe_count = count > 1.0 ? count : 1.0;
        mean = __ddiv_rn(sums[stat], safe_count);
        const double mean_square = __ddiv_rn(sums_sq[stat], safe_count);
        const double spread = __dsub_rn(mean_square, __dmul_rn(mean, mean));
        variance = spread >= 0.0 ? spread : 0.0;  // as NumPy's maximum(spread, 0)
    }
    const double root = __dsqrt_rn(variance);
    const double scale = root >= min_std ? root : min_std;
    const double value = __ddiv_rn(__dsub_rn(x[at], mean), scale);
    const double logit = value < -logit_cap ? -logit_cap : (value > logit_cap ? logit_cap : value);
    z[at] = __double2float_rn(value);
    base_logits[at] = __double2float_rn(logit);
}
