#!/usr/bin/env bash
# Every open GPU measurement in one command, sized to finish within 10 minutes on one GPU:
# the GPU tests and the source checks, then benchmarks/gpu_learn.py (layer-pass timings for the
# launch constants, learn / predict / latency, the plain CuPy path and, when carried, pygln),
# the shared prediction kernel under a grid of its settings (gpu_shared_grid.py), the constants
# read off them and the headline rates with those constants (gpu_tuned.py), then
# Nsight Compute, then the measurements already made on earlier runs: the steps run from the
# most needed, so that a run cut off at the call's limit loses the least.
#
#   bash benchmarks/gpu_session.sh            # from the repository root, on a GPU machine
#
# Reads, when present: .peers/mnist (MNIST's IDX files; random data otherwise), .peers/pygln
# (a checkout of github.com/aiwabdn/pygln) and .peers/base (the gln package of the commit last
# measured, for benchmarks/gpu_compare.py's side-by-side runs, whose lines are appended to
# gpu_learn.jsonl: a call brings back 8 files). Writes into $OUT (default ./gpu-out): device.txt,
# tests.log, gpu_learn.jsonl (with gpu_shared_grid.py's and gpu_tuned.py's lines),
# gpu_learn.err, gpu_stages.jsonl (with gpu_staging.py's lines), gpu_gating_tf32.jsonl, ncu.txt
# (Nsight Compute's reading of one prediction chunk's kernels and two learning chunks', by the
# library's kernels and by a warp per row, where ncu is found), snapshot_bytes.jsonl; the
# launch constants read off gpu_learn.jsonl are printed (benchmarks/gpu_constants.py reads them
# again from the file). docs/gpu.md says how to set up .peers.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv \
    > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

# The device machines have no Redis or FastAPI: no conftest above tests/gln (whose own gives
# the cp fixture). The emulated variants already ran on the CPU (CI): only the real GPU's here.
# First, alone in a new process: the test of sending while staging, whose launch must not be
# its kernel's first in the process (test_uploads.py says why).
timeout 60 "$PYTHON" -m pytest -q --confcutdir=tests/gln -rs \
    -k "sent_while_staging_is_sent_before and gpu" tests/gln/test_uploads.py \
    > "$OUT/tests.log" 2>&1
echo "sending while staging, first in its process: exit $?"
timeout 240 "$PYTHON" -m pytest -q --confcutdir=tests/gln -rs -k "not emulated" \
    tests/gln/test_cuda_backend.py tests/gln/test_cuda_sources.py tests/gln/test_uploads.py \
    >> "$OUT/tests.log" 2>&1
echo "tests: exit $?"
grep -E "passed|failed|error" "$OUT/tests.log" | tail -3

args=()
[ -d .peers/mnist ] && args+=(--data-dir .peers/mnist)
[ -d .peers/pygln ] && args+=(--pygln-dir .peers/pygln)
timeout 300 "$PYTHON" benchmarks/gpu_learn.py "${args[@]}" \
    > "$OUT/gpu_learn.jsonl" 2> "$OUT/gpu_learn.err"
echo "gpu_learn: exit $?"
grep -v '"layer_pass"' "$OUT/gpu_learn.jsonl"
tail -5 "$OUT/gpu_learn.err"

# The shared prediction kernel of each layer under every combination of its sums batched at
# once, warps a block and examples at once, in alternating turns (appended to gpu_learn.jsonl):
# what chooses PREDICT_SUM_BATCH, PREDICT_WARPS and PREDICT_EXAMPLE_GROUP.
timeout 150 "$PYTHON" benchmarks/gpu_shared_grid.py \
    >> "$OUT/gpu_learn.jsonl" 2>> "$OUT/gpu_learn.err"
echo "gpu_shared_grid: exit $?"

data_args=()
[ -d .peers/mnist ] && data_args+=(--data-dir .peers/mnist)

# The launch constants of gln/kernels/cuda.py, read off the layer_pass and shared_grid lines.
constants=$(mktemp)
"$PYTHON" benchmarks/gpu_constants.py "$OUT/gpu_learn.jsonl" | tee "$constants"

# The headline learning and 4,096-row prediction rates with the recommended constants beside
# the library's, in alternating rounds, so that a default changed on this run's evidence comes
# with its figures (appended to gpu_learn.jsonl).
timeout 90 "$PYTHON" benchmarks/gpu_tuned.py "$constants" "${data_args[@]}" \
    >> "$OUT/gpu_learn.jsonl" 2>> "$OUT/gpu_learn.err"
echo "gpu_tuned: exit $?"
grep -E '"gpu_tuned"' "$OUT/gpu_learn.jsonl"

# What bounds each kernel of a prediction chunk and two learning chunks (bandwidths, issue, warp
# stalls, occupancy), by Nsight Compute's counters, with the card's clocks left as they are.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -n "$NCU" ]; then
    timeout 200 "$NCU" --profile-from-start off --clock-control none \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        "$PYTHON" benchmarks/gpu_profile.py "${data_args[@]}" > "$OUT/ncu.txt" 2>&1
    echo "ncu: exit $?"
    grep -E "^  [a-z_]+|Duration|Memory Throughput|Compute \(SM\) Throughput" "$OUT/ncu.txt" \
        | head -60
fi

# This checkout's predictions against the commit last measured, alternating, in one run, each
# pass followed by one inside GLN.page_locked (where a checkout has it).
if [ -d .peers/base/gln ]; then
    timeout 90 "$PYTHON" benchmarks/gpu_compare.py .peers/base . --page-locked "${data_args[@]}" \
        >> "$OUT/gpu_learn.jsonl" 2>> "$OUT/gpu_learn.err"
    echo "gpu_compare: exit $?"
    grep '"gpu_compare"' "$OUT/gpu_learn.jsonl"
fi

# Where one-row and 4,096-row calls spend their time, stage by stage, and the host's cost of
# single CuPy operations.
timeout 100 "$PYTHON" benchmarks/gpu_stages.py "${data_args[@]}" > "$OUT/gpu_stages.jsonl" 2>&1
echo "gpu_stages: exit $?"
cat "$OUT/gpu_stages.jsonl"

# Where a float32 call's first chunk spends the host's time before the device can start, by
# staging setting (appended to gpu_stages.jsonl).
timeout 60 "$PYTHON" benchmarks/gpu_staging.py "${data_args[@]}" >> "$OUT/gpu_stages.jsonl" 2>&1
echo "gpu_staging: exit $?"
grep '"gpu_staging"' "$OUT/gpu_stages.jsonl" | cut -c1-400

# Whether the gating GEMM could run on tensor cores: TF32 products, plain and split in three,
# their time and their error against the float64 product.
timeout 60 "$PYTHON" benchmarks/gpu_gating_tf32.py "${data_args[@]}" \
    > "$OUT/gpu_gating_tf32.jsonl" 2>&1
echo "gpu_gating_tf32: exit $?"
cat "$OUT/gpu_gating_tf32.jsonl"

# A GPU model's bytes both ways (a snapshot or export, a restore or import). Last: the least
# needed, so that a run cut off at the call's limit loses only this.
timeout 20 "$PYTHON" benchmarks/snapshot_bytes.py --device cuda --runs 5 \
    > "$OUT/snapshot_bytes.jsonl" 2>&1
echo "snapshot_bytes: exit $?"
cat "$OUT/snapshot_bytes.jsonl"
