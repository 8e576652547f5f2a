#!/usr/bin/env bash
# Issue #32: the graph runner's inputs staged as one contiguous run and copied up in one copy (before: a strided
# [4, S] view, which torch copies through a pageable temporary and a copy kernel, then the tables in a second
# copy), and a one-row step's MLP in one launch (kernels.mlp). costs: the host's cost of the copies and of the
# graph runner's launch, over each tree's graph runner; mlp: SmolLM2's one-row step with the MLP in one launch
# and in two (cuda-two-launch-mlp), kernels profiled, one process; ab: this tree against .before (a worktree of
# ccbe11b, its tests, docs and results removed), each in its own process, alternated.
#
#   STAGES="costs mlp regress ab" bash bench/results/gpu_staging/run.sh   # carry .whl, .cache/smollm2-tokenizer, .before
#   STAGES="sweep ab" OUT=... bash bench/results/gpu_staging/run.sh       # the one-launch MLP's shapes; the staging alone
#   STAGES="regress full" OUT=... bash bench/results/gpu_staging/run.sh   # every GPU test; SmolLM2, ours and the peer
#
# The mlp and sweep stages ran at 6446586 and 9caeed3 (kernels.mlp and bench/mlp_one_launch.py, removed after).
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_staging  # out, PY, log, left, stage, regress
for s in ${STAGES:-costs mlp regress ab}; do
  case $s in
    costs) stage costs  # this tree's host_launch_costs.py, over each tree's graph runner
      for tree in . .before; do
        name=$([ "$tree" = . ] && echo this || echo before)
        PYTHONPATH="$PWD/$tree" timeout 120 $PY bench/host_launch_costs.py --batches 1,16 --calls 2000 \
          >"$out/costs_$name.md" 2>&1
        echo "costs $name rc=$?" | tee -a "$log"; grep -E "inputs up|graph runner" "$out/costs_$name.md" | tee -a "$log"
      done ;;
    mlp) stage mlp
      timeout 150 $PY bench/engine_cuda_profile.py --shape smollm2-135m --batch 1 --kernels 24 \
        --backends cuda,cuda-two-launch-mlp,cuda,cuda-two-launch-mlp --out "$out" >"$out/mlp.log" 2>&1
      echo "mlp rc=$?" | tee -a "$log"; grep -E "^## |steps:" "$out/kernels_smollm2-135m_b1.md" | tee -a "$log" ;;
    sweep) stage sweep  # the one-launch MLP's launch shapes against the two launches (bench/mlp_one_launch.py)
      timeout 200 $PY bench/mlp_one_launch.py --shapes 576x1536,1024x3072 --rounds 3 >"$out/mlp_sweep.md" 2>&1
      echo "sweep rc=$?" | tee -a "$log"; tee -a "$log" <"$out/mlp_sweep.md" ;;
    ab) stage ab  # SmolLM2 free and under both grammars at batches 1 and 16, each tree in its own process
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for tree in . .before; do
          name=$([ "$tree" = . ] && echo this || echo before)
          [ "$(left)" -lt 90 ] && { echo "ab round $r $name: skipped (time)" | tee -a "$log"; continue; }
          (cd "$tree" && PYTHONPATH="$PWD" timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda.py \
            --shapes smollm2-135m --batches 1,16 --grammar-batches 1,16 --grammar-rounds 3 --grammar-tools --tokens 64 --skip-transformers --peer-batches= --ttft= --budget-s 140 \
            --out "$out/ab_${name}_$r" >"$out/ab_${name}_$r.log" 2>&1)
          echo "ab round $r $name rc=$?" | tee -a "$log"; grep -E "^\|" "$out/ab_${name}_$r/engine_cuda.md" | tail -n 12 | tee -a "$log"
        done
      done ;;
    regress) regress ;;
    full) BATCHES=1,16,64 engine_bench smollm2-135m 1,16 ;;
  esac
done
stage done
