#!/usr/bin/env bash
# One device call on the GPU host's 16 idle CPU cores (issue #31, the c=1 goal): this tree's
# bench/gateway_overhead.py --alternate 7 (direct, the bare forwarder and the gateway, the c=1
# requests interleaved), then --ab against the tree before the change (.before: a git worktree of
# it, carried). Carries .whl/ (bash bench/wheelhouse.sh 3.12 .whl; WHL names another copy of it), .wrk/ (wrk and the libluajit,
# libssl and libcrypto it links, copied from a Debian host) and .before/.
set -u
export PATH=$PWD/.wrk:$PATH LD_LIBRARY_PATH=$PWD/.wrk
deps=$(python3 -c "import tomllib; print(' '.join(d.split(';')[0].replace(' ', '') for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] if not d.startswith(('numpy', 'onnxruntime'))))")
{ python3 -m pip install --no-index --find-links ${WHL:-.whl} --no-build-isolation --no-deps -e . && python3 -m pip install --no-index --find-links ${WHL:-.whl} $deps; } > $OUT/pip.log 2>&1 || tail -5 $OUT/pip.log
nproc; lscpu | grep "Model name"
timeout ${ALT_S:-230} python3 bench/gateway_overhead.py --alternate 7 --no-litellm --requests 1000 --seconds 5 --out $OUT/alt.json > $OUT/alt.log 2>&1
tail -2 $OUT/alt.log
timeout ${AB_S:-150} python3 bench/gateway_overhead.py --ab .before --requests 1000 --rounds 10 --out $OUT/ab.json > $OUT/ab.log 2>&1
tail -3 $OUT/ab.log
