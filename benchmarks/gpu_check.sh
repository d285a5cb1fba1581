#!/usr/bin/env bash
# GPU check of the CUDA backend (one GPU, < 8 minutes): build the zoo for CUDA, run it,
# compare with onnxruntime, time ours vs TVM's default CUDA pipeline vs PyTorch; JSON out.
#   benchmarks/gpu_check.sh                 # h100 preset (sm_90); HW=a100 for sm_80
#   benchmarks/gpu_check.sh --dry-run       # no GPU: builds + nvcc only
# Extra arguments go to gpu_check.py. The run is cut at 7.5 minutes whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
HW="${HW:-h100}"
OUT="${OUT:-benchmarks/results/gpu_check_${HW}.json}"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
command -v nvcc >/dev/null 2>&1 || { echo "gpu_check.sh: nvcc not found" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec timeout --signal=INT --kill-after=15 450 \
  python benchmarks/gpu_check.py --hw "$HW" --out "$OUT" --budget-s 360 "$@"
