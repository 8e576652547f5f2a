#!/usr/bin/env bash
# Regenerate the checked-in examples under deploy/examples/ (run from the repository root).
# tests/cluster/test_examples.py fails when they are stale.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m switchyard.cli plan --cluster deploy/clusters/spark8.yaml --policy policies/spark8.yaml \
  --emit deploy/examples/spark8 --plot deploy/examples/spark8/capacity.png
python -m switchyard.cli plan --cluster deploy/clusters/ring4.yaml --policy policies/ring4.yaml \
  --emit deploy/examples/ring4 --plot deploy/examples/ring4/capacity.png
