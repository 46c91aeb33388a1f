#!/usr/bin/env bash
# The GPU check of the TFLA kernels in about 7 minutes on one CUDA GPU, from the repository root
# of a checkout on a machine whose python3 holds torch, triton, pytest and pyyaml:
#
#   packages/tfla-mlstm/benchmarks/gpu_check.sh [OUT_DIR]      (default reports/gpu/tfla-mlstm)
#
# 1. the gpu-marked tests (bf16 / fp16 bounds, large chunks), the memory and the anchor tests,
#    compiled, with --require-gpu, at most 100 s;
# 2. bench_chunkwise.py --device cuda (our mLSTM and mLSTMsig against the anchor's
#    triton_xl_chunk_siging and SDPA at S = 2048, 8192, 32768), at most 110 s;
# 3. gpu_diag.py (held and peak memory, profiler tables, each kernel alone, state-kernel and
#    backward-kernel tiles, chunk sizes), at most 150 s;
# 4. the remaining interpreter-parity kernel tests, compiled, at most 60 s.
#
# The anchor, mlstm-kernels (and einops, which it imports), is used where python3 imports it, else
# installed without network from the wheels in ANCHOR_WHEEL_DIR (default build/wheels, ignored by
# git: copy mlstm_kernels-2.0.6-py3-none-any.whl and an einops wheel there and carry the folder to
# the machine). Without it the anchor's rows and tests are skipped, and environment.txt says so.
# OUT_DIR receives five files: environment.txt, pytest.log, bench.log, diag.log (each stage's
# output, tables included) and detail.tar.gz (the benchmark's JSON / Markdown tables, diag.json,
# the profiler tables). The exit status is 1 when a stage failed or ran out of time.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
out="${1:-reports/gpu/tfla-mlstm}"
detail="$out/detail"
mkdir -p "$detail"
PYTHONPATH="kernels-common/src:packages/tfla-mlstm/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

wheels="${ANCHOR_WHEEL_DIR:-build/wheels}"
if ! python3 -c "import mlstm_kernels.torch" 2>/dev/null && [ -d "$wheels" ]; then
  anchor="$(mktemp -d)"
  python3 -m pip install --quiet --no-deps --no-index --target "$anchor" "$wheels"/*.whl \
    && PYTHONPATH="$PYTHONPATH:$anchor"
fi

{
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  python3 -c "import mlstm_kernels.torch, importlib.metadata as m; print('mlstm-kernels', m.version('mlstm-kernels'))" \
    || echo "mlstm-kernels NOT importable: the anchor's rows and tests are skipped"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  date -u
} 2>&1 | tee "$out/environment.txt"

status=0
tests="packages/tfla-mlstm/tests"
common=(--require-gpu -p no:cacheprovider -W default::DeprecationWarning -W default::FutureWarning)
timeout 100 python3 -m pytest "${common[@]}" -m gpu "$tests/test_tfla_kernels.py" \
  "$tests/test_tfla_memory.py" "$tests/test_peer.py" 2>&1 | tee "$out/pytest.log" || status=1

# the anchor's mLSTM kernel (triton_xl_chunk, not _siging) aborts the process under triton 3.6
timeout 110 python3 packages/tfla-mlstm/benchmarks/bench_chunkwise.py --device cuda \
  --out "$detail/bench" --exclude "triton_xl_chunk (L" 2>&1 | tee "$out/bench.log" || status=1

timeout 150 python3 packages/tfla-mlstm/benchmarks/gpu_diag.py --out "$detail/diag" \
  --deadline 140 2>&1 | tee "$out/diag.log" || status=1

timeout 60 python3 -m pytest "${common[@]}" -m "not gpu" "$tests/test_tfla_kernels.py" \
  "$tests/test_tfla_memory.py" 2>&1 | tee -a "$out/pytest.log" || status=1

tar -czf "$out/detail.tar.gz" -C "$out" detail && rm -rf "$detail"
exit $status
