#!/usr/bin/env bash
# One-shot GPU validation of rlslice's GPU backends (run once on a GPU node, under 8
# minutes with every step at its timeout, so a 15-minute device lease leaves room to rerun).
#
# Assumes: an NVIDIA driver r570+ (CUDA 12.8+), `python3` with torch built for CUDA, and this
# repository installed with `pip install -e .[cuda]`. Optional: `cuda-checkpoint` on PATH
# (adds the CLI comparison). Run from the repository root:
#
#     OUT=/some/dir tools/gpu_check.sh
#     DRY_RUN=1 tools/gpu_check.sh     # no GPU needed: checks every step's command against
#                                      # today's CLI (argument parsing, pytest collection)
#                                      # and the time budget, runs nothing
#
# Steps, each under its own `timeout`, each going on when an earlier one failed:
#   1. versions (driver, GPU, persistence mode, torch, cuda-bindings, pynvml, rlslice probe:
#      the probe's cuda line says which copy path the node gets and why)
#   2. pytest -m gpu on tests/system/gpu/test_on_device.py       -> $OUT/pytest_gpu.txt, .xml
#   3. rlslice bench swap --backend app --gib 20 --overlap --json
#      (serial and overlapped switches next to pinned D2H/H2D of the same bytes, measured in
#      the same run; losses bit-identical)                -> $OUT/bench_app.json
#   4. rlslice bench swap --backend cuda --gib 4 --json [--compare-cli]: where the driver
#      offers custom storage (CUDA 13.4+), the swaps go through the agent's pinned ring and
#      the same job is then moved through the driver's pageable path, side by side (target
#      >= 5x); driver 580 lacks it, and the report says so  -> $OUT/bench_cuda.json
#   5. examples/grpo_tiny/compare.py --device cuda --backend app
#      (two GRPO jobs alone vs time-sliced, bit-identical)  -> $OUT/grpo_app.json
#   6. examples/ddp_tiny/nccl_check.py: the NCCL communicators' path of a parked job
#      (suspend with NCCL >= 2.29.7, else rebuild; read through ctypes from the libnccl
#      torch loaded, beside torch's own version), and the rebuild path run for real on a
#      one-rank NCCL group (destroyed, rebuilt, all_reduce agrees)  -> $OUT/nccl.json
# The transparent PyTorch path (MemorySaverOffloader over torch-memory-saver) runs in step 2
# when torch-memory-saver is installed on the node (the device has no network: install it
# beforehand); its comparison with the registered path at 20 GiB is not scripted yet.
# $OUT/summary.txt lists each step's exit status (124 = timed out).
set -u

OUT="${OUT:-./gpu-check-out}"
PY="${PYTHON:-python3}"
GIB="${GIB:-20}"
CUDA_GIB="${CUDA_GIB:-4}"
DRY_RUN="${DRY_RUN:-0}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 2
: > "$OUT/summary.txt"

# Timeouts (seconds). The worst case, every step at its timeout plus the kill grace, must
# stay under 8 minutes: checked below, before anything runs.
KILL=5
T_VERSIONS=75   # nvidia-smi 10 + python 25 + cuda-checkpoint 10 + probe 30
T_PIP=15
T_PYTEST=80
T_BENCH_APP=100  # 120 until the NCCL step came; no run has needed more than 100 yet
T_BENCH_CUDA=90  # 100 likewise
T_GRPO=60
T_NCCL=30       # one torch + CUDA + NCCL start, a group destroyed and rebuilt
WORST=$((T_VERSIONS + T_PIP + T_PYTEST + T_BENCH_APP + T_BENCH_CUDA + T_GRPO + T_NCCL + 5 * KILL))
if [ "$WORST" -ge 480 ]; then
  echo "gpu_check: the steps' timeouts add up to ${WORST}s, not under 8 minutes" >&2
  exit 2
fi
echo "worst case ${WORST}s" >> "$OUT/summary.txt"

dry_check() {  # dry_check COMMAND... : would today's CLI accept it?
  case " $* " in
    *" rlslice.apps.cli "*)
      local args=("$@")
      while [ "${args[0]}" != "rlslice.apps.cli" ]; do args=("${args[@]:1}"); done
      "$PY" -c 'import sys; from rlslice.apps.cli import build_parser; build_parser().parse_args(sys.argv[1:])' \
        "${args[@]:1}" ;;
    *" pytest "*)
      "$PY" -m pytest --collect-only -q -m gpu -p no:cacheprovider tests/system/gpu/test_on_device.py > /dev/null ;;
    *" examples/"*)
      local script
      for script in "$@"; do case $script in examples/*) break ;; esac; done
      "$PY" "$script" --help > /dev/null ;;
    *) return 0 ;;
  esac
}

step() {  # step NAME SECONDS COMMAND... : run with a timeout, record the status
  local name=$1 seconds=$2
  shift 2
  echo "=== $name (timeout ${seconds}s): $*" >&2
  local start=$SECONDS rc
  if [ "$DRY_RUN" = 1 ]; then
    dry_check "$@"
    rc=$?
    echo "$name dry-run rc=$rc" | tee -a "$OUT/summary.txt" >&2
    return 0
  fi
  timeout --kill-after="$KILL" "$seconds" "$@"
  rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt" >&2
  return 0
}

versions() {
  date -u
  timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode,pcie.link.gen.current,pcie.link.width.current --format=csv || true
  timeout 25 "$PY" - <<'EOF'
import platform
print("python", platform.python_version())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device 0:", torch.cuda.get_device_name(0))
except Exception as error:
    print("torch: not usable:", error)
try:
    from cuda.bindings import driver, __version__ as bindings_version
    print("cuda-bindings", bindings_version)
    print("cuInit", driver.cuInit(0)[0].name, "cuDriverGetVersion", driver.cuDriverGetVersion())
except Exception as error:
    print("cuda-bindings: not usable:", error)
try:
    import pynvml
    pynvml.nvmlInit()
    print("NVML driver", pynvml.nvmlSystemGetDriverVersion())
except Exception as error:
    print("pynvml: not usable:", error)
import rlslice
print("rlslice", rlslice.__version__)
EOF
  command -v cuda-checkpoint && timeout 10 cuda-checkpoint --help | head -3
  timeout 30 "$PY" -m rlslice.apps.cli probe || true
}

echo "=== versions"
if [ "$DRY_RUN" = 1 ]; then
  step probe "$T_VERSIONS" "$PY" -m rlslice.apps.cli probe
else
  versions 2>&1 | tee "$OUT/versions.txt"
fi

if ! "$PY" -c "import pytest, pytest_asyncio" 2>/dev/null && [ "$DRY_RUN" != 1 ]; then
  echo "pytest / pytest-asyncio missing: trying pip (skip the step if that fails)"
  timeout "$T_PIP" "$PY" -m pip install -q pytest pytest-asyncio pytest-timeout || true
fi
if "$PY" -c "import pytest, pytest_asyncio" 2>/dev/null; then
  step pytest_gpu "$T_PYTEST" "$PY" -m pytest -m gpu -v -rs -p no:cacheprovider \
    --junitxml="$OUT/pytest_gpu.xml" tests/system/gpu/test_on_device.py 2>&1 | tee "$OUT/pytest_gpu.txt"
else
  echo "pytest_gpu rc=skipped (pytest not installed)" | tee -a "$OUT/summary.txt"
fi

step bench_app "$T_BENCH_APP" "$PY" -m rlslice.apps.cli bench swap --backend app --gib "$GIB" --overlap \
  --swaps 4 --json > "$OUT/bench_app.json"
[ "$DRY_RUN" = 1 ] || cat "$OUT/bench_app.json"

CLI=()
if command -v cuda-checkpoint > /dev/null; then CLI=(--compare-cli); fi
step bench_cuda "$T_BENCH_CUDA" "$PY" -m rlslice.apps.cli bench swap --backend cuda --gib "$CUDA_GIB" --json \
  "${CLI[@]}" > "$OUT/bench_cuda.json"
[ "$DRY_RUN" = 1 ] || cat "$OUT/bench_cuda.json"

step grpo_app "$T_GRPO" "$PY" examples/grpo_tiny/compare.py --device cuda --backend app \
  --steps 10 --json "$OUT/grpo_app.json" 2>&1 | tail -8

step nccl "$T_NCCL" "$PY" examples/ddp_tiny/nccl_check.py --json "$OUT/nccl.json" 2>&1 | tail -12

echo "total seconds=$SECONDS" >> "$OUT/summary.txt"
echo "=== summary ($OUT)"
cat "$OUT/summary.txt"
