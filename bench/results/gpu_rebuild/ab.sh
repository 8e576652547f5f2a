#!/usr/bin/env bash
# One device call: bench/engine_cuda.py batch 1 and 16 of the tree before the single decoder
# (df8e1b8, copied to .before/ by `git archive df8e1b8 switchyard bench/engine_cuda.py
# pyproject.toml`) and of this one, alternating which goes first, ROUNDS rounds; py-spy on the
# grammar-constrained SmolLM2 decode (issue #32's open question); then the GPU tests in the time
# left of DEADLINE seconds. Everything is packed into $OUT/ab_run.tgz (a device run returns 8 files).
set -uo pipefail
cd "$(dirname "$0")/../../.."
final=${OUT:-bench/results/gpu_rebuild}; out=$(mktemp -d)
trap 'tar -czf "$final/ab_run.tgz" -C "$out" .' EXIT
PY=${PYTHON:-python3}
left() { echo $(( ${DEADLINE:-540} - SECONDS )); }
# onnxruntime (the gateway's classifier, 27 MB) stays behind: a device run carries 64 MiB in all.
deps=$($PY -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
{ $PY -m pip install --no-index --find-links .whl --no-build-isolation --no-deps -e . &&
  $PY -m pip install --no-index --find-links .whl $deps llguidance gguf pytest-asyncio pytest-timeout safetensors \
    tokenizers jinja2 hypothesis jsonschema py-spy; } >"$out/pip.log" 2>&1 || tail -5 "$out/pip.log"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; $PY -c "import torch; print(torch.__version__)"
args="--shapes llama-8b,smollm2-135m --batches ${BATCHES:-1,16} --tokens 64 --skip-transformers --ttft="
for r in $(seq 1 "${ROUNDS:-2}"); do
  trees="before after"; [ $((r % 2)) = 0 ] && trees="after before"
  for t in $trees; do
    if [ $t = before ]; then dir=.before extra=""; else dir=. extra="--peer-batches="; fi
    (cd $dir && PYTHONPATH=$PWD timeout 100 $PY bench/engine_cuda.py $args $extra --out "$out/r${r}_$t" 2>&1 |
       grep -E "decode_tok_s +b=|copy bandwidth" | sed "s/^/r$r $t /")
  done
done
for b in 1 16; do
  timeout 45 py-spy record -r 250 -f raw --nonblocking -o "$out/grammar_b$b.txt" -- \
    $PY bench/engine_cuda_profile.py --shape smollm2-135m --batch $b --tokens 1500 --grammar 2>&1 | tail -n 2
done
echo "tests with $(left) s left"
OUT=$out PYTHON=$PY timeout "$(left)" bash bench/gpu_check.sh tests >/dev/null 2>&1; tail -n 3 "$out/gpu_tests.log"
echo "done at ${SECONDS}s"
