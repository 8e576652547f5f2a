# Sourced by the device-call scripts of bench/results/*/run.sh: `. bench/device_env.sh NAME` from the
# repository root. It sets out (the results folder: $OUT, else bench/results/NAME/out), PY, log, left()
# (seconds before DEADLINE, default 570), stage() and pack(); installs the project and its packages from the carried
# wheelhouse .whl (bench/wheelhouse.sh); writes the device, the host and the versions into $log; and defines
# the stages the scripts share: regress and engine_bench (at the end).
set -uo pipefail
out=$(realpath -m "${OUT:-bench/results/$1/out}"); mkdir -p "$out"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" SWITCHYARD_TEST_TOKENIZER_DIR="$PWD/.cache/smollm2-tokenizer"
log="$out/run.log"
left() { echo $(( ${DEADLINE:-570} - SECONDS )); }
stage() { echo "== $1 at ${SECONDS}s ($(left) s left)" | tee -a "$log"; }
deps=$($PY -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
$PY -m pip install --no-index --find-links .whl --no-build-isolation --no-deps -e . >"$out/pip.log" 2>&1
# shellcheck disable=SC2086
$PY -m pip install --no-index --find-links .whl $deps llguidance gguf pytest-asyncio jsonschema >>"$out/pip.log" 2>&1 ||
  tail -5 "$out/pip.log"
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader; nproc; lscpu | grep "Model name"
  $PY -c "import torch, triton, llguidance; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'sm', torch.cuda.get_device_capability(), 'llguidance', llguidance.__version__)"; } 2>&1 | tee -a "$log"
# The scripts' shared stages. regress: every GPU test (bench/gpu_check.sh tests) into $out/regress.
regress() {
  stage regress
  OUT="$out/regress" PYTHON=$PY timeout "$(( $(left) - 5 ))" bash bench/gpu_check.sh tests >/dev/null 2>&1
  echo "regress rc=$?" | tee -a "$log"; tail -n 3 "$out/regress/gpu_tests.log" | tee -a "$log"
}
# engine_bench SHAPES GRAMMAR: bench/engine_cuda.py, ours and the compiled peer in one run at $BATCHES, the
# shapes and grammar batches given (unless $SHAPES / $GRAMMAR say), $TOKENS tokens (64); TOOLS=1: a tool-call
# grammar's rows too, in the same rounds.
engine_bench() {
  stage bench
  timeout "$(( $(left) - 5 ))" $PY bench/engine_cuda.py --shapes "${SHAPES:-$1}" --batches "$BATCHES" \
    --tokens "${TOKENS:-64}" --ttft= --grammar-batches "${GRAMMAR:-$2}" --grammar-rounds 3 ${TOOLS:+--grammar-tools} \
    --skip-transformers --peer-batches "$BATCHES" --budget-s "$(( $(left) - 30 ))" --out "$out" >/dev/null 2>&1
  echo "bench rc=$?" | tee -a "$log"; grep -E "^\|" "$out/engine_cuda.md" | head -n 30 | tee -a "$log"
}
# pack: the last stage's mark, then everything under $out as one file, $out/all.tgz: a call's many files
# would otherwise be left out of what comes back.
pack() {
  stage done
  tar -C "$out" -czf "$out.tgz" --exclude=pip.log . && rm -rf "${out:?}"/* && mv "$out.tgz" "$out/all.tgz"
}
