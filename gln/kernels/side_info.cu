// Per-row side information in one launch: gln.scaling.per_row_side_info.
//
// Each row centred on its own mean, optionally blurred (B_rows Z B_cols^T for an image Z of
// height x width, the Gaussian matrices of gln.scaling.gaussian_blur_matrix), then rescaled to
// norm sqrt(d); a constant row gives 0. In CuPy that is about fourteen launches, and the blur's
// batched GEMM may round differently for different batch sizes, which would make a chunk differ
// from its rows learned one at a time. Here one warp owns one row and every sum has a fixed
// order (lanes take every 32nd element, then a butterfly), so a row's result never depends on
// the chunk. It equals NumPy's up to the rounding of those sums.

#define GLN_SIDE_LANES 32

__device__ __forceinline__ double gln_warp_sum(double v) {
    for (int offset = GLN_SIDE_LANES / 2; offset > 0; offset >>= 1) {
        v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;  // the same bits on every lane: IEEE addition is commutative
}

extern "C" __global__ void __launch_bounds__(128)
gln_per_row_side_info(const double* __restrict__ x, int n, int height, int width, int blurred,
                      const double* __restrict__ blur_rows, const double* __restrict__ blur_cols,
                      double* __restrict__ scratch, float* __restrict__ z) {
    const long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (t >= n) return;  // whole warps: the block size is a multiple of 32
    const int d = height * width;
    const double* row = x + t * d;
    double* centred = scratch + t * 2LL * d;  // the centred row, then B_rows times it
    double* smoothed = centred + d;
    double total = 0.0;
    for (int i = lane; i < d; i += GLN_SIDE_LANES) total = __dadd_rn(total, row[i]);
    const double mean = __ddiv_rn(gln_warp_sum(total), static_cast<double>(d));
    for (int i = lane; i < d; i += GLN_SIDE_LANES) centred[i] = __dsub_rn(row[i], mean);
    const double* out = centred;
    if (blurred) {
        __syncwarp();
        for (int i = lane; i < d; i += GLN_SIDE_LANES) {  // (B_rows Z)[r, c]
            const int r = i / width, c = i - r * width;
            double v = 0.0;
            for (int k = 0; k < height; ++k) {
                v = __dadd_rn(v, __dmul_rn(blur_rows[r * height + k], centred[k * width + c]));
            }
            smoothed[i] = v;
        }
        __syncwarp();
        for (int i = lane; i < d; i += GLN_SIDE_LANES) {  // (B_rows Z B_cols^T)[r, c]
            const int r = i / width, c = i - r * width;
            double v = 0.0;
            for (int k = 0; k < width; ++k) {
                v = __dadd_rn(v, __dmul_rn(smoothed[r * width + k], blur_cols[c * width + k]));
            }
            centred[i] = v;  // each lane rewrites only elements it alone reads from here on
        }
    }
    double squares = 0.0;
    for (int i = lane; i < d; i += GLN_SIDE_LANES) {
        squares = __dadd_rn(squares, __dmul_rn(out[i], out[i]));
    }
    const double norm = __dsqrt_rn(gln_warp_sum(squares));
    const double scale = norm > 0.0 ? __ddiv_rn(__dsqrt_rn(static_cast<double>(d)), norm) : 0.0;
    for (int i = lane; i < d; i += GLN_SIDE_LANES) {
        z[t * d + i] = __double2float_rn(__dmul_rn(out[i], scale));
    }
}
