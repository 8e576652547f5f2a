#!/usr/bin/env bash
# bench/engine.py of the tree before the single decoder (df8e1b8, a worktree at ../before) and of
# this one, alternating which goes first each round. ROUNDS (default 2) rounds, threads 1 and 2.
cd "$(dirname "$0")/../../.."
main=$PWD before=${BEFORE:-$PWD/../before}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for th in 1 2; do
    trees="$before $main"; [ $((r % 2)) = 0 ] && trees="$main $before"
    for tree in $trees; do
      echo "== round $r threads $th tree $tree"
      (cd "$tree" && PYTHONPATH=$tree "$main/.venv/bin/python" bench/engine.py --peer none --repeats 3 \
         --tokens 32 --batch 16 --threads "$th" 2>&1 | grep -E "^ours")
    done
  done
done
