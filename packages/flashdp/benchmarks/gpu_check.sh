#!/usr/bin/env bash
# flashdp's GPU check, one short run (about 6 minutes on one H200):
#   1. the kernel, plan and synchronisation tests compiled (--require-gpu: nothing may skip);
#   2. the side-by-side step benchmark (non-DP, flashdp per-layer and flat, Opacus hooks and
#      ghost) on GPT-2 small, T=1024, B=8, bf16, with torch.profiler tables of the top kernels of
#      the non-DP and the flashdp per-layer step;
#   3. the same benchmark on the Llama-shaped model (12 layers, width 1024).
#
#   packages/flashdp/benchmarks/gpu_check.sh [OUT_DIR]      (default reports/gpu/flashdp)
#
# The machine's python3 must hold torch, triton and pytest. Without network access, set WHEELS to
# a folder holding opacus' wheel (pure Python) to get the Opacus rows; without it they are skipped
# with a warning.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
out="${1:-reports/gpu/flashdp}"
mkdir -p "$out"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install --quiet --no-index --find-links "$WHEELS" --no-deps opacus opt_einsum \
    2>&1 | tee "$out/install.log"
fi
export PYTHONPATH="kernels-common/src:packages/flashdp/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
{
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u
} 2>&1 | tee "$out/environment.txt"
status=0
timeout 240 python3 -m pytest --require-gpu -p no:cacheprovider -q \
  packages/flashdp/tests/test_kernels.py packages/flashdp/tests/test_plan.py \
  2>&1 | tee "$out/pytest.log" || status=1
timeout 180 python3 packages/flashdp/benchmarks/bench_flashdp.py --device cuda --out "$out" \
  --profile 2>&1 | tee "$out/bench_gpt2.log" || status=1
timeout 150 python3 packages/flashdp/benchmarks/bench_flashdp.py --device cuda --shape llama \
  --out "$out" 2>&1 | tee "$out/bench_llama.log" || status=1
exit $status
