#!/usr/bin/env bash
# bench/engine.py of the tree before the single decoder (df8e1b8) and of this one, alternating.
cd /work/main
for r in 1 2; do
  for th in 1 2; do
    for tree in /work/before /work/main; do
      [ $((r % 2)) = 0 ] && tree=$([ $tree = /work/before ] && echo /work/main || echo /work/before)
      echo "== round $r threads $th tree $tree"
      (cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python bench/engine.py --peer none --repeats 3 --tokens 32 --batch 16 --threads $th 2>&1 | grep -E "^ours")
    done
  done
done
