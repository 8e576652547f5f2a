#!/usr/bin/env bash
# One device call (the GPU host's 16 CPU cores, no GPU used): bench/gateway_overhead.py --alternate 7 with
# the c=1 requests interleaved. Carries .whl/ (bash bench/wheelhouse.sh 3.12 .whl) and .wrk/ (wrk and
# the libluajit, libssl and libcrypto it links, copied from a Debian host).
set -u
export PATH=$PWD/.wrk:$PATH LD_LIBRARY_PATH=$PWD/.wrk
deps=$(python3 -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
{ python3 -m pip install --no-index --find-links .whl --no-build-isolation --no-deps -e . && python3 -m pip install --no-index --find-links .whl $deps; } > $OUT/pip.log 2>&1 || tail -5 $OUT/pip.log
wrk --version 2>&1 | head -1; nproc; lscpu | grep "Model name"
timeout 400 python3 bench/gateway_overhead.py --alternate 7 --no-litellm --requests 1000 --seconds 5 --out $OUT/gateway_overhead_h200host_interleaved.json > $OUT/gateway_overhead_h200host_interleaved.log 2>&1
tail -4 $OUT/gateway_overhead_h200host_interleaved.log
