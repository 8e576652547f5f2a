#!/usr/bin/env bash
# Issue #32's batch-64 goal on one H200, in device calls of at most 10 minutes (bench/results/gpu_b64/README.md):
#
#   STAGES="profile sweep kernels" bash bench/results/gpu_b64/run.sh   # call 1: where a 64-row step's time goes
#   STAGES="bench tests profile" CANDIDATES=cuda bash bench/results/gpu_b64/run.sh   # call 2: figures, GPU tests
#
# profile: bench/engine_cuda_profile.py --kernels on the 8B shape at batch 64, each of CANDIDATES;
# sweep:   bench/engine_cuda_sweep.py, the candidates' step time at 16..64 rows on both shapes;
# kernels: bench/cuda_kernels_sweep.py, the fused kernels' launch shapes at 32 and 64 rows against the
#          cuBLAS path's launches, and the paged attention's at 64 rows;
# bench:   bench/engine_cuda.py at batch 1, 16, 64 on both shapes, the compiled peer in the same run, and
#          its --sweep of the decode backends and their variants at 1..64 rows;
# tests:   bench/gpu_check.sh tests.
# Each stage under `timeout`, the whole within DEADLINE seconds; logs and tables go to $OUT (a device run
# returns 8 files: the tables, the log, and everything packed into run.tgz).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-bench/results/gpu_b64/out}; mkdir -p "$out/all"
trap 'cp "$out"/*.md "$out/all/" 2>/dev/null; tar -czf "$out/run.tgz" -C "$out/all" .' EXIT
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
log="$out/run.log"
left() { echo $(( ${DEADLINE:-560} - SECONDS )); }
stage() { echo "== $1 at ${SECONDS}s ($(left) s left)" | tee -a "$log"; }
if [[ " $STAGES " == *" tests "* ]]; then  # the tests import the gateway's packages too
  deps=$($PY -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
  $PY -m pip install --no-index --find-links .whl --no-build-isolation --no-deps -e . >"$out/all/pip.log" 2>&1
  # shellcheck disable=SC2086
  $PY -m pip install --no-index --find-links .whl $deps llguidance gguf pytest-asyncio jsonschema >>"$out/all/pip.log" 2>&1 ||
    tail -5 "$out/all/pip.log"
else  # the benches need llguidance alone beyond the image
  $PY -m pip install --no-index --no-deps .whl/llguidance-*.whl >"$out/all/pip.log" 2>&1 || tail -5 "$out/all/pip.log"
fi
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee -a "$log"
CANDIDATES=${CANDIDATES:-cuda-torch-glue,cuda,cuda-fused-rows-64}
for s in ${STAGES:-profile sweep kernels}; do
  case $s in
    profile) stage profile
      timeout "$(( $(left) < 150 ? $(left) : 150 ))" $PY bench/engine_cuda_profile.py --shape llama-8b --batch 64 --kernels 16 --backends "$CANDIDATES" \
        --out "$out" >"$out/all/profile.log" 2>&1; echo "profile rc=$?" | tee -a "$log"
      grep -E "^## |steps: GPU" "$out"/kernels_*.md | tee -a "$log" ;;
    sweep) stage sweep
      timeout 210 $PY bench/engine_cuda_sweep.py --shapes llama-8b,smollm2-135m --batches 16,32,48,64 --parts-batches "" \
        --backends "$CANDIDATES" --tokens 64 --budget-s 190 --out "$out/all" >/dev/null 2>&1; echo "sweep rc=$?" | tee -a "$log"
      cp "$out/all/engine_cuda_sweep.md" "$out/"; grep -E "^\| (llama|smollm)" "$out/engine_cuda_sweep.md" | tee -a "$log" ;;
    kernels) stage kernels
      t=$(( $(left) - 45 )); [ "$t" -gt 60 ] || t=60
      timeout "$t" $PY bench/cuda_kernels_sweep.py --shapes llama-8b --rows 32,64 --budget-s $(( t - 40 )) \
        --out "$out/all/kernels" >"$out/all/kernels.log" 2>&1; echo "kernels rc=$?" | tee -a "$log"
      cp "$out/all/kernels/sweep.md" "$out/kernels_sweep.md"; cat "$out/kernels_sweep.md" | tee -a "$log"
      timeout 40 $PY bench/cuda_kernels_sweep.py --shapes llama-8b --rows 64 --kernels none --attention-spans 256 \
        --out "$out/all/attention" >"$out/all/attention.log" 2>&1; echo "attention rc=$?" | tee -a "$log"
      grep -E "^attention" "$out/all/attention.log" | tee -a "$log" ;;
    bench) stage bench
      timeout 200 $PY bench/engine_cuda.py --shapes llama-8b,smollm2-135m --batches 1,16,64 --tokens 64 \
        --peer-batches 1,16,64 --skip-transformers --ttft= --sweep --sweep-batches 1,4,16,64 --parts-batches= \
        --sweep-backends cuda,cuda-fused-rows-0,cuda-attention-by-span --budget-s 185 --out "$out/all" >/dev/null 2>&1
      echo "bench rc=$?" | tee -a "$log"; cp "$out/all/engine_cuda.md" "$out/"; grep -E "decode_tok_s|bandwidth" "$out/all/engine_cuda.log" | tee -a "$log" ;;
    tests) stage tests
      OUT="$out/all" PYTHON=$PY timeout "$(( $(left) - 10 ))" bash bench/gpu_check.sh tests >/dev/null 2>&1
      echo "tests rc=$?" | tee -a "$log"; tail -n 3 "$out/all/gpu_tests.log" | tee -a "$log" ;;
  esac
done
stage done
