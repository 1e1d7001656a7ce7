#!/usr/bin/env bash
# The GPU check in one command, for a machine with one CUDA GPU and no network:
# installs the Ray wheels carried in .whl/ (packed beforehand on a machine with
# a registry), runs the GPU tier (`make test-gpu`) and benchmarks/gpu_state.py,
# and writes their logs, the benchmark's JSON and a summary under $OUT.
# Each step has its own time limit (90 + 200 + 160 s, and 10 s each to end:
# the whole check stays within 8 minutes): a hang costs that step, not the
# ones after it.
#
#   OUT=/some/dir bash scripts/gpu-check.sh
#
# Environment: OUT (default /tmp/gpu-check-out), PY (default python3),
# GPU_CHECK_SKIP_INSTALL=1 (Ray is importable already: no wheels installed),
# GPU_CHECK_SIZES_GB (default 1,4,16), GPU_CHECK_TIER_S (default 200),
# GPU_CHECK_BENCH_S (default 160), GPU_CHECK_DISK (torch.save's folder;
# default the repository, on local disk).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-${TMPDIR:-/tmp}/gpu-check-out}
PY=${PY:-python3}
SIZES=${GPU_CHECK_SIZES_GB:-1,4,16}
TIER_S=${GPU_CHECK_TIER_S:-200}
BENCH_S=${GPU_CHECK_BENCH_S:-160}
DISK=${GPU_CHECK_DISK:-$PWD}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

note() { echo "$*" >>"$SUMMARY"; }

# step NAME SECONDS COMMAND...: COMMAND's output to $OUT/NAME.log; killed, with
# the processes it started (timeout signals its whole process group), after SECONDS.
step() {
  local name=$1 limit=$2 started rc
  shift 2
  started=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local verdict="exit $rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && verdict="cut short after its ${limit} s"
  note "$name: $verdict, $(($(date +%s) - started)) s"
  return "$rc"
}

# -- Ray from the carried wheels ------------------------------------------------
if [ "${GPU_CHECK_SKIP_INSTALL:-0}" = 1 ]; then
  note "install: skipped (GPU_CHECK_SKIP_INSTALL=1)"
elif ! ls .whl/*.whl >/dev/null 2>&1; then
  note "install: no wheels in .whl/ (pack them first: bash ../shared/device/pack-ray.sh 3.12 2.60.0; carry .whl)"
  exit 2
else
  step install 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

# -- what this machine is ---------------------------------------------------------
{
  date -u
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; else echo "no nvidia-smi"; fi
  "$PY" -c 'import sys, torch, ray, pytest; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), "ray", ray.__version__, "pytest", pytest.__version__)' 2>&1
  echo "NUMA nodes: $(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l); CPUs: $(nproc)"
  free -g | head -2
  df -h "$DISK" /tmp /dev/shm 2>&1
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"
CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)

# -- the GPU tier ----------------------------------------------------------------
if command -v make >/dev/null; then
  step tier "$TIER_S" make --no-print-directory test-gpu PY="$PY"
else
  step tier "$TIER_S" "$PY" -m pytest -q -rs --durations=10 tests/gpu
fi
tier=$?
grep -E "passed|failed|skipped|error|^(SKIPPED|FAILED|ERROR) " "$OUT/tier.log" | tail -20 >>"$SUMMARY"

# -- the benchmark ---------------------------------------------------------------
if [ "$CUDA" = 1 ]; then
  bench=(--sizes-gb "$SIZES" --repeats 2)
else
  note "bench: no CUDA device here: the CPU path at 0.05 GB instead (no figures for the GPU)"
  bench=(--device cpu --sizes-gb 0.05 --repeats 2)
fi
step bench "$BENCH_S" "$PY" benchmarks/gpu_state.py "${bench[@]}" --dir "$DISK" --json "$OUT/gpu_state.json"
bench_rc=$?
sed -n '/^## save_state/,$p' "$OUT/bench.log" >>"$SUMMARY"

note "gpu-check: tier exit $tier, bench exit $bench_rc (CUDA: $CUDA)"
cat "$SUMMARY"
[ "$tier" -eq 0 ] && [ "$bench_rc" -eq 0 ]
