#!/usr/bin/env bash
# Issue #32's SmolLM2 grammar goal: where the host's turn goes under a grammar at batch 1 and 16
# (bench/engine_cuda_profile.py --host-split), the GPU's busy and idle time a step (--kernels), and the
# host's cost of each launch of the sampling stage (bench/host_launch_costs.py).
#
#   bash bench/results/gpu_grammar_host/run.sh   # carry .whl, .cache/smollm2-tokenizer
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_grammar_host  # out, PY, log, left, stage
for s in ${STAGES:-split1 split16 kernels}; do
  stage "$s"
  case $s in
    split1) timeout 200 $PY bench/engine_cuda_profile.py --batch 1 --tokens 400 --rounds 2 \
      --host-split free,items,tools >"$out/split_b1.md" 2>"$out/split_b1.err" ;;
    split16) timeout 150 $PY bench/engine_cuda_profile.py --batch 16 --tokens 120 --rounds 2 \
      --host-split free,items,tools >"$out/split_b16.md" 2>"$out/split_b16.err" ;;
    costs) timeout 150 $PY bench/host_launch_costs.py --batches 1,16 --calls 2000 >"$out/costs.md" 2>&1 ;;
    kernels) for g in "" "--grammar items"; do
        # shellcheck disable=SC2086
        timeout 90 $PY bench/engine_cuda_profile.py --batch 1 --kernels 24 $g --out "$out/kernels${g:+_grammar}" \
          >>"$out/kernels.log" 2>&1; done ;;
  esac
  echo "$s rc=$?" | tee -a "$log"
done
stage done
