#!/usr/bin/env bash
# The GPU check of issue 41, one script of at most 5 minutes on a CUDA machine (H100 class):
#   1. `cape bench gpu`: no host sync in a training step with each encoding
#      (torch.cuda.set_sync_debug_mode("error")), a CAPE training step captured in a CUDA graph
#      and replayed, bf16 autocast within tolerance of fp32 with phases kept in float32, and the
#      fused (triton) kernels against the eager path;
#   2. `cape bench slowdown` on the GPU: every encoding against nopos in Table 9's form
#      (fp32 and bf16, lengths 10, 100, 1000);
#   3. the main job's quick preset (`cape experiment vision`) with its wall time.
# Usage, from the repository root: bash scripts/gpu_check.sh [OUT]   (default results/gpu-check)
# The machine needs torch with CUDA and cape's lab extra (numpy, pyyaml, pillow, tqdm,
# safetensors, scipy, filelock); cape itself runs from src/ (no install, no network).
# Each step has its own time limit; the exit code is the first failing step's, 0 when all pass.
set -uo pipefail
OUT=${1:-results/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cape() { "$PY" -c 'import sys; from cape.lab.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }

"$PY" - <<'EOF' || exit 2
import importlib.util, sys
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, devices {torch.cuda.device_count()}")
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device on this machine")
print("device:", torch.cuda.get_device_name(0))
missing = [m for m in ("numpy", "yaml", "PIL", "tqdm", "safetensors", "scipy", "filelock", "triton")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing modules {missing}: carry their wheels (device README)")
EOF

status=0
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, time it
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "gpu_check: $name exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

step checks 90 cape bench gpu --out "$OUT/gpu"
step table9 60 cape bench slowdown --device cuda \
  --encodings nopos,sinpos,cape1d,abspos,relpos-100,rotary,xpos,alibi,fire,lff \
  --models layer,encoder --lengths 10,100,1000 --dtypes fp32,bf16 --runs 10 --out "$OUT/table9"
step main-job 150 cape experiment vision --out "$OUT/vision-quick"
cat "$OUT/summary.txt"
exit "$status"
