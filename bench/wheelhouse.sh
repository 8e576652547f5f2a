#!/usr/bin/env bash
# The gateway's wheels for a host without internet (the 16-core GPU host: Python 3.12, a stock torch image):
# downloaded here by pip for that host's Python and platform, carried there, installed with --no-index.
#
#   bash bench/wheelhouse.sh [PYVER] [DIR]       # default: 3.12 into .whl/ (git-ignored)
#   # on the host, in a copy of the tree with .whl/ beside it:
#   python -m pip install --no-index --find-links .whl --no-build-isolation -e .
#   python bench/gateway_workers.py --workers 1 2 4 8 --rounds 3 --loader python
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${1:-3.12}"
DIR="${2:-.whl}"
PIP="${PIP:-python3 -m pip}"
mkdir -p "$DIR"
# manylinux_2_31: llguidance 1.6 is the newest wheel up to 2_28, and it takes one eos token where
# chat/grammar.py passes a list (bench/results/gpu_b64/README.md); the host runs 1.9 (2_31) fine.
# The runtime dependencies in pyproject.toml but numpy, plus setuptools and wheel
# for the editable install without build isolation, and what the engine's GPU runs need beyond the
# image (GPU_EXTRAS; GPU_EXTRAS= leaves them out).
deps=$(python3 - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(d.split(";")[0].replace(" ", "") for d in deps if not d.startswith("numpy")))
PY
)
# shellcheck disable=SC2086
$PIP download --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform linux_x86_64 --dest "$DIR" $deps setuptools wheel ${GPU_EXTRAS-llguidance gguf pytest-asyncio jsonschema}
# numpy comes with the torch image (pip still fetches it for onnxruntime): left out, so the folder
# stays under the 64 MiB a device run carries. KEEP_NUMPY=1 keeps it.
[ "${KEEP_NUMPY:-0}" = 1 ] || rm -f "$DIR"/numpy-*.whl
ls "$DIR" | wc -l
du -sh "$DIR"
