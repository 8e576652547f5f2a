# Sourced by the device-call scripts of bench/results/*/run.sh: `. bench/device_env.sh NAME` from the
# repository root. It sets out (the results folder: $OUT, else bench/results/NAME/out), PY, log, left()
# (seconds before DEADLINE, default 570) and stage(); installs the project and its packages from the carried
# wheelhouse .whl (bench/wheelhouse.sh); and writes the device, the host and the versions into $log.
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
