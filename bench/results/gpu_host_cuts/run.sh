#!/usr/bin/env bash
# Issue #32: the sampling stage's host cuts (grammar masks read in place from pinned memory, the mask
# kernel launched through its compiled handle, the tokens downloaded into reused pinned buffers, the graph
# runner's staging events reused), against the same tree with them undone (engine_cuda.grammar_variants),
# alternated in the same rounds; then the host's cost of each launch and the host's turn by part again.
#
#   STAGES="ab costs split1" bash bench/results/gpu_host_cuts/run.sh    # carry .whl, .cache/smollm2-tokenizer
#   STAGES=regress bash bench/results/gpu_host_cuts/run.sh              # every GPU test
#   DEADLINE=450 STAGES=full bash bench/results/gpu_host_cuts/run.sh    # ours and the compiled peer, one run
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_host_cuts  # out, PY, log, left, stage, regress
for s in ${STAGES:-ab costs split1}; do
  case $s in
    ab) stage ab
      timeout "$(( $(left) < 330 ? $(left) - 5 : 330 ))" $PY bench/engine_cuda.py --shapes smollm2-135m,llama-8b \
        --batches= --grammar-batches 1,16 --grammar-rounds 3 --grammar-ab --grammar-tools --tokens 64 \
        --skip-transformers --peer-batches= --ttft= --budget-s 320 --out "$out" >"$out/ab.log" 2>&1
      echo "ab rc=$?" | tee -a "$log"; grep -E "^\|" "$out/engine_cuda.md" | tail -n 24 | tee -a "$log" ;;
    costs) stage costs
      timeout 100 $PY bench/host_launch_costs.py --batches 1,16 --calls 2000 >"$out/costs.md" 2>&1
      echo "costs rc=$?" | tee -a "$log" ;;
    split1) stage split1
      timeout 120 $PY bench/engine_cuda_profile.py --batch 1 --tokens 400 --rounds 2 --host-split free,items,tools \
        >"$out/split_b1.md" 2>"$out/split_b1.err"
      echo "split1 rc=$?" | tee -a "$log" ;;
    regress) regress ;;
    full) { echo "cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null)"; nproc; } | tee -a "$log"
      BATCHES=1,16,64 engine_bench smollm2-135m,llama-8b 1,16 ;;
  esac
done
stage done
