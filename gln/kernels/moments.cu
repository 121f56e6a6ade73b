// Running input moments for a chunk, as gln.scaling.moments_before_each_row computes them.
//
// NumPy's cumsum along the rows is a sequential fold, so a chunk's prefix sums equal those of
// its rows taken one call at a time, bit for bit. CuPy's cumsum is a parallel scan that rounds
// differently. This kernel keeps the fold: one thread per feature walks the rows in order, in
// float64, with explicitly rounded operations (no fused multiply-add), so with v = x - shift
// (each difference rounded; the shift is the first row learned, gln.scaling says why)
//   sums[t]    = total    + v[0]        + ... + v[t-1]          (left to right)
//   sums_sq[t] = total_sq + v[0] * v[0] + ... + v[t-1] * v[t-1] (each product rounded first)
// exactly as NumPy computes cumsum(concatenate([total, v])) and cumsum(... v * v).
// Consecutive threads read consecutive features of a row, so every load and store coalesces.
// The same launch writes each row's count, counts[t] = count + t (exact: integers below 2^53),
// which would otherwise take two more launches; it needs max(n, num_features) threads.
//
// The totals are updated in place and the count before the chunk is read from device memory,
// so the launch has the same arguments on every call: a captured call (a CUDA graph) replays it.

// The fold over rows of either type: float32 rows (a long chunk's, as they were sent) are read
// as the float64 values they equal, so the sums are those of the widened rows, bit for bit.
template <typename Row>
__device__ __forceinline__ void running_moments(
        const Row* __restrict__ x, const double* __restrict__ shift, double* __restrict__ total,
        double* __restrict__ total_sq, double* __restrict__ sums, double* __restrict__ sums_sq,
        int n, int num_features, const double* __restrict__ count,
        double* __restrict__ counts) {
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f < n) counts[f] = __dadd_rn(*count, static_cast<double>(f));
    if (f >= num_features) return;
    const double offset = shift[f];
    double s = total[f];
    double q = total_sq[f];
    // The loads do not depend on the running sums: unrolling puts several rows in flight.
#pragma unroll 8
    for (int t = 0; t < n; ++t) {
        const long long at = static_cast<long long>(t) * num_features + f;
        const double v = __dsub_rn(static_cast<double>(x[at]), offset);
        sums[at] = s;
        sums_sq[at] = q;
        s = __dadd_rn(s, v);
        q = __dadd_rn(q, __dmul_rn(v, v));
    }
    total[f] = s;  // only this thread reads or writes feature f of the totals
    total_sq[f] = q;
}

// Its entry points: gln_running_moments for float64 rows, gln_running_moments_f32 for float32.
#define GLN_MOMENTS_PARAMETERS                                                                  \
    const double *__restrict__ shift, double *__restrict__ total,                             \
        double *__restrict__ total_sq, double *__restrict__ sums, double *__restrict__ sums_sq, \
        int n, int num_features, const double *__restrict__ count, double *__restrict__ counts
#define GLN_MOMENTS_ARGUMENTS shift, total, total_sq, sums, sums_sq, n, num_features, count, counts

extern "C" __global__ void __launch_bounds__(128)
gln_running_moments(const double* __restrict__ x, GLN_MOMENTS_PARAMETERS) {
    running_moments(x, GLN_MOMENTS_ARGUMENTS);
}

extern "C" __global__ void __launch_bounds__(128)
gln_running_moments_f32(const float* __restrict__ x, GLN_MOMENTS_PARAMETERS) {
    running_moments(x, GLN_MOMENTS_ARGUMENTS);
}

// A family of models' moments (gln.family): the chunk's rows grouped by member (stably), run r
// member run_members[r]'s rows [run_starts[r], run_starts[r + 1]), no member in two runs; the
// members' shifts and totals (M, num_features), and each run's member's count before the
// chunk, run_counts (runs,). blockIdx.y picks the run, and the run is running_moments on its
// member's rows, shift and totals: each member's sums are those of a model of its own that
// learned its rows alone, bit for bit. gridDim.x covers max(longest run, num_features).
template <typename Row>
__device__ __forceinline__ void family_running_moments(
        const Row* __restrict__ x, const long long* __restrict__ run_members,
        const long long* __restrict__ run_starts, const double* __restrict__ run_counts,
        int runs, const double* __restrict__ shifts, double* __restrict__ totals,
        double* __restrict__ totals_sq, double* __restrict__ sums,
        double* __restrict__ sums_sq, int num_features, double* __restrict__ counts) {
    for (int run = blockIdx.y; run < runs; run += gridDim.y) {
        const long long begin = run_starts[run];
        const long long member = run_members[run] * num_features;
        const long long first = begin * num_features;
        running_moments(x + first, shifts + member, totals + member, totals_sq + member,
                        sums + first, sums_sq + first,
                        static_cast<int>(run_starts[run + 1] - begin), num_features,
                        run_counts + run, counts + begin);
    }
}

#define GLN_FAMILY_MOMENTS_PARAMETERS                                                           \
    const long long *__restrict__ run_members, const long long *__restrict__ run_starts,      \
        const double *__restrict__ run_counts, int runs, const double *__restrict__ shifts,   \
        double *__restrict__ totals, double *__restrict__ totals_sq,                          \
        double *__restrict__ sums, double *__restrict__ sums_sq, int num_features,            \
        double *__restrict__ counts
#define GLN_FAMILY_MOMENTS_ARGUMENTS                                                            \
    run_members, run_starts, run_counts, runs, shifts, totals, totals_sq, sums, sums_sq,      \
        num_features, counts

extern "C" __global__ void __launch_bounds__(128)
gln_family_running_moments(const double* __restrict__ x, GLN_FAMILY_MOMENTS_PARAMETERS) {
    family_running_moments(x, GLN_FAMILY_MOMENTS_ARGUMENTS);
}

extern "C" __global__ void __launch_bounds__(128)
gln_family_running_moments_f32(const float* __restrict__ x, GLN_FAMILY_MOMENTS_PARAMETERS) {
    family_running_moments(x, GLN_FAMILY_MOMENTS_ARGUMENTS);
}
