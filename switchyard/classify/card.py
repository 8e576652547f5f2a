"""The model card (NAME.md beside NAME.onnx), written from a training run's own measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from switchyard.classify.train import LABELS, TrainResult


def _table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def render(r: TrainResult, trained: dict[str, Any], data_section: str, command: str) -> str:
    conf = [["true \\ predicted", *LABELS]] + [[LABELS[i], *map(str, row)] for i, row in enumerate(r.confusion)]
    cats = [["category", "held-out cases", "accuracy"]] + [
        [c, str(n), f"{a:.3f}"] for c, (n, a) in sorted(r.per_category.items())
    ]
    v = trained.get("versions", {})
    return f"""# {r.path.stem}: request complexity classifier

Labels: `simple` (the small pool will do) and `complex` (send it to the large pool).
Files: `{r.path.name}` (the estimator, ONNX) and `{r.path.with_suffix('.json').name}` (labels, feature
spec, sha256 of the .onnx, training summary; checked when a policy loads the model).

Reproduce: `{command}` (about a minute on 2 cores; deterministic).

## Data and labels

{data_section}

## Model

Features (switchyard/classify/features.py, vectorize.py): the last user turn, lowercased, tokens
`[a-z0-9_]+` over its first 1000 characters, unigrams and bigrams hashed (crc32) into
{trained.get('hash_dim', 4096)} binary, L2-normalised buckets; plus log1p of the numeric features
(tool count, schema size, tool parameters, user turns, messages, last message is a tool result /
an error, tool calls so far, prompt length, text length, parallelism cues, enumerations, numbers,
question marks, total user text). Text is hashed in Python on both sides; only the estimator
(StandardScaler on the numeric columns, logistic regression) is exported with skl2onnx, so the
ONNX graph has no string ops (no tokeniser drift, no locale requirement).

Estimator: {trained.get('estimator')}.
Versions: scikit-learn {v.get('scikit-learn')}, skl2onnx {v.get('skl2onnx')}, Python {v.get('python')}.

## How it scores (held-out)

Split: {trained.get('split')}. Train {r.n_train}, held out {r.n_test}.

**Held-out accuracy: {r.accuracy:.4f}**

{_table(conf)}

{_table(cats)}

ONNX vs scikit-learn `predict_proba` on the held-out rows: max |difference| {r.parity_max_abs_diff:.2g}.

## Latency

Features + vectorize + onnxruntime, one request at a time, over the held-out requests, measured
while training ({r.latency_us.get('cpus', 0):.0f} CPUs, load average {r.latency_us.get('load_avg_1m', 0):.2f}; on a
shared machine p99 mostly measures other processes): p50 {r.latency_us['p50']:.1f} us, p99 {r.latency_us['p99']:.1f} us.

## Benchmark

Not run for this build yet: `python bench/classifier.py --card {r.path.with_suffix('.md')}` measures
the classifier against a sentence-embedding baseline and writes its figures here.

## Limits

- One request per BFCL case (its first user turn); later turns of multi-turn cases, tool
  results and errors are not in the training data, so those features carry little weight.
- Category labels are a proxy for "the small model will fail". Retrain on your own outcomes:
  `switchyard classifier train --outcomes outcomes.jsonl --out classifiers/mine.onnx`, then pick the
  threshold with `switchyard classifier calibrate --model classifiers/mine.onnx --target-large-share 0.25`.
"""


BFCL_DATA = """BFCL v4 (the `bfcl-eval` 2026.3.23 wheel from PyPI, read in place; see DEVELOPERS.md). One
OpenAI chat request per case: the case's first user turn (and system message, if any) with the
functions it offers as `tools` (multi-turn cases: the functions of their API classes, minus the
excluded and initially missing ones).

- `complex`: parallel, multiple, parallel_multiple, live_multiple, live_parallel,
  live_parallel_multiple, multi_turn_base, multi_turn_long_context, multi_turn_miss_func,
  multi_turn_miss_param (several calls, a choice among several functions, or several turns).
- `simple`: simple_python, simple_java, simple_javascript, live_simple (one call of the one
  function), irrelevance, live_irrelevance (the right answer is no call) and live_relevance (any
  one call is right). These relevance checks are single-step decisions, so they count as simple.
- Not used: memory, web_search, format_sensitivity (they need BFCL's agentic harness)."""


def write(path: Path, text: str) -> Path:
    card = path.with_suffix(".md")
    card.write_text(text, encoding="utf-8")
    return card
