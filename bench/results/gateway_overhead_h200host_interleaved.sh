#!/usr/bin/env bash
# One device call (the GPU host's 16 CPU cores; then the GPU for an 8B sweep): bench/gateway_overhead.py --alternate 7 with
# the c=1 requests interleaved. Carries .whl/ (bash bench/wheelhouse.sh 3.12 .whl) and .wrk/ (wrk and
# the libluajit, libssl and libcrypto it links, copied from a Debian host).
set -u
export PATH=$PWD/.wrk:$PATH LD_LIBRARY_PATH=$PWD/.wrk
deps=$(python3 -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
{ python3 -m pip install --no-index --find-links .whl --no-build-isolation --no-deps -e . && python3 -m pip install --no-index --find-links .whl $deps llguidance gguf; } > $OUT/pip.log 2>&1 || tail -5 $OUT/pip.log
wrk --version 2>&1 | head -1; nproc; lscpu | grep "Model name"
timeout 200 python3 bench/gateway_overhead.py --alternate 7 --no-litellm --requests 1000 --seconds 5 --out $OUT/gateway_overhead_h200host_interleaved.json > $OUT/gateway_overhead_h200host_interleaved.log 2>&1
tail -4 $OUT/gateway_overhead_h200host_interleaved.log
# Then, while the machine is up: issue #32's unmeasured point, the 8B shape's fused layers against the
# cuBLAS path with rope_write (cuda-fused-rows-0) at 2-16 rows, through the served loop.
timeout 170 python3 bench/engine_cuda_sweep.py --shapes llama-8b --batches 2,4,8,16 --parts-batches "" \
  --backends cuda,cuda-fused-rows-0 --tokens 64 --budget-s 150 --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep rc=$?"; grep -E "^\| llama" $OUT/sweep/engine_cuda_sweep.md
