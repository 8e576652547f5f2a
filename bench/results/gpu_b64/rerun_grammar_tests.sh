#!/usr/bin/env bash
# Call 3: the four grammar tests that failed in call 2 on the llguidance carried then (1.6.1, whose
# LLTokenizer takes one eos token, not the list chat/grammar.py passes), again with 1.9.1
# (the version the CPU tests run; its wheel is tagged manylinux_2_31). Logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-bench/results/gpu_b64/out}; mkdir -p "$out"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" SWITCHYARD_TEST_TOKENIZER_DIR="$PWD/.cache/smollm2-tokenizer"
deps=$($PY -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
{ $PY -m pip install --no-index --find-links .whl --no-build-isolation --no-deps -e . &&
  # shellcheck disable=SC2086
  $PY -m pip install --no-index --find-links .whl $deps llguidance gguf pytest-asyncio jsonschema; } >"$out/pip.log" 2>&1 ||
  tail -5 "$out/pip.log"
$PY -c "import llguidance; print('llguidance', llguidance.__version__)" 2>&1 | tee "$out/gpu_tests_grammar.log"
timeout 150 $PY -m pytest -q -p no:cacheprovider -rs tests/engine/test_cuda_serve.py \
  "tests/engine/test_structured.py::test_gpu_masks_equal_the_cpu_kernel" 2>&1 | tee -a "$out/gpu_tests_grammar.log"
