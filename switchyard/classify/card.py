"""The model card (NAME.md beside NAME.onnx), written from a training run's own measurements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.classify.scores import reliability_rows
from switchyard.classify.train import LABELS, TrainResult


@dataclass(frozen=True)
class Kind:
    """What a model predicts: the card's title and what its two labels mean."""

    title: str
    labels_meaning: dict[str, str]


BFCL_KIND = Kind("request complexity classifier",
                 {"simple": "the small pool will do", "complex": "send it to the large pool"})
OUTCOMES_KIND = Kind("outcome router (predicts the small pool's failures)",
                     {"simple": "the small pool answers it rightly", "complex": "the small pool gets it wrong"})


def _table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _split_section(r: TrainResult, split: dict[str, Any]) -> str:
    suites = split.get("suites", {})
    held = split.get("held_out_by", {})
    names = ", ".join(f"`{n}` ({len(ids)} cases)" for n, ids in suites.items()) or "none"
    by = ", ".join(f"{n} by {k}" for k, n in held.items())
    return f"""Groups: {split.get('groups')}. Held out: {split.get('held_out')}.
Suites held out: {names}; their case ids are stored in the sidecar (`trained.split.suites`), so
`switchyard classifier eval` and `switchyard replay --held-out` rebuild this split exactly, and a
test checks that no suite case (nor any case of a suite case's group) is on the training side.

Train {r.n_train} cases ({split.get('groups_train')} groups), held out {r.n_test} ({split.get('groups_held_out')} groups: {by})."""


def render(r: TrainResult, trained: dict[str, Any], data_section: str, command: str, kind: Kind = BFCL_KIND) -> str:
    conf = [["true \\ predicted", *LABELS]] + [[LABELS[i], *map(str, row)] for i, row in enumerate(r.confusion)]
    cats = [["category", "held-out cases", "accuracy"]] + [
        [c, str(n), f"{a:.3f}"] for c, (n, a) in sorted(r.per_category.items())
    ]
    v = trained.get("versions", {})
    s = r.scores
    auc = "-" if s.roc_auc is None else f"{s.roc_auc:.4f}"
    meaning = kind.labels_meaning
    return f"""# {r.path.stem}: {kind.title}

Labels: `simple` ({meaning['simple']}) and `complex` ({meaning['complex']}).
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

## Split

{_split_section(r, trained.get('split', {}))}

## How it scores (held-out)

**Held-out accuracy: {r.accuracy:.4f}**; P(complex): **ROC AUC {auc}**, Brier score {s.brier:.4f}
(predicting the held-out base rate, {s.positives}/{s.n}, for every case scores {s.brier_base_rate:.4f}).

{_table(conf)}

Reliability of P(complex) on the held-out cases (does a predicted 0.7 come true 7 times in 10?):

{_table(reliability_rows(s))}

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

- One request per case (BFCL: its first user turn); later turns of multi-turn cases, tool
  results and errors are not in the training data, so those features carry little weight.
- {LIMIT_BFCL if kind is BFCL_KIND else LIMIT_OUTCOMES}
"""


LIMIT_BFCL = """Category labels are a proxy for "the small model will fail". Retrain on your own outcomes:
  `switchyard classifier train --outcomes outcomes.jsonl --out classifiers/mine.onnx`, then pick the
  threshold with `switchyard classifier calibrate --model classifiers/mine.onnx --target-large-share 0.25`."""
LIMIT_OUTCOMES = """It predicts the failures of the model that produced the outcomes, on the kind of
  requests in them; another small model, or other traffic, needs its own outcomes. Pick the threshold
  for a share of large calls with `switchyard classifier calibrate --model MODEL --target-large-share 0.25`."""


def outcomes_data(name: str, n: int, fails: int, small_pool: str, target: str) -> str:
    return f"""Outcomes file `{name}`: {n} cases, of which the small pool `{small_pool}` got {fails} wrong
({100 * fails / max(n, 1):.1f}%). `complex` = {target}; `simple` otherwise. One request per case, as
it was sent (format: switchyard/classify/outcomes.py)."""


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
