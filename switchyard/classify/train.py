"""Training and ONNX export (needs the `train` extra: scikit-learn, skl2onnx).

Pipeline: the Python vectorizer (hashed text + log1p numeric features, see vectorize.py) feeds a
scikit-learn Pipeline [ColumnTransformer(text passthrough, StandardScaler on numeric) ->
LogisticRegression]. Only that estimator pipeline is exported to ONNX, so the ONNX graph has no
text ops: no tokeniser to drift, no locale to be missing, probabilities equal predict_proba.
"""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from switchyard.classify.features import Features, extract
from switchyard.classify.model_file import ModelMeta, sha256_bytes, write_meta
from switchyard.classify.scores import ProbabilityScores, score_probabilities
from switchyard.classify.split import Split
from switchyard.classify.vectorize import FeatureSpec, Vectorizer

LABELS = ["simple", "complex"]  # index = class id; "complex" means: send it to the large pool
INPUT, OUTPUT = "input", "probabilities"


@dataclass
class Example:
    id: str
    group: str  # examples of one group stay on one side of the split
    category: str
    label: int
    features: Features
    held_out: bool
    body: dict[str, Any] = field(default_factory=dict)
    holdout_reason: str | None = None  # why it is held out (split.Split.reason)


@dataclass
class TrainResult:
    path: Path
    n_train: int
    n_test: int
    accuracy: float
    confusion: list[list[int]]  # rows: true label, columns: predicted, in LABELS order
    per_category: dict[str, tuple[int, float]]
    parity_max_abs_diff: float
    latency_us: dict[str, float]
    scores: ProbabilityScores  # P(complex) on the held-out side: ROC AUC, Brier, reliability
    trained: dict[str, Any] = field(default_factory=dict)  # what the sidecar records


def fit(x: np.ndarray, y: np.ndarray, spec: FeatureSpec, c: float = 1.0) -> Any:
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    cols = ColumnTransformer(
        [
            ("text", "passthrough", list(range(spec.hash_dim))),
            ("numeric", StandardScaler(), list(range(spec.hash_dim, spec.width))),
        ]
    )
    pipe = Pipeline([("cols", cols), ("clf", LogisticRegression(C=c, max_iter=5000))])
    pipe.fit(x, y)
    return pipe


def to_onnx(pipe: Any, spec: FeatureSpec) -> bytes:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    clf = pipe.named_steps["clf"]
    model = convert_sklearn(
        pipe,
        initial_types=[(INPUT, FloatTensorType([None, spec.width]))],
        options={id(clf): {"zipmap": False}},  # a plain tensor: no per-call dict building
        final_types=None,
    )
    names = [o.name for o in model.graph.output]
    if OUTPUT not in names:
        raise RuntimeError(f"skl2onnx produced outputs {names}, expected {OUTPUT!r}")
    model.doc_string = "switchyard request classifier; see the sidecar .json beside this file"
    # Byte-identical rebuilds: skl2onnx names the graph with a random uuid and lists opsets in set order.
    model.graph.name = "switchyard_request_classifier"
    opsets = sorted(model.opset_import, key=lambda o: o.domain)
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    return model.SerializeToString()


def save(path: Path, onnx_bytes: bytes, spec: FeatureSpec, trained: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.part")
    tmp.write_bytes(onnx_bytes)
    tmp.replace(path)
    write_meta(path, ModelMeta(list(LABELS), spec, INPUT, OUTPUT, sha256_bytes(onnx_bytes), trained))


def example(split: Split, case_id: str, category: str, complex_: bool, body: dict[str, Any]) -> Example:
    reason = split.reason(case_id)
    return Example(case_id, split.groups.key(case_id), category, LABELS.index("complex" if complex_ else "simple"),
                   extract(body), reason is not None, body, reason)


def bfcl_examples(split: Split) -> list[Example]:
    from switchyard.classify.bfcl import load_cases
    from switchyard.datasets import bfcl_zip

    with bfcl_zip() as zf:
        cases = load_cases(zf)
    return [example(split, c.id, c.category, c.label == "complex", c.body) for c in cases]


def _latency(clf: Any, examples: list[Example]) -> dict[str, float]:
    """Per-request time of features + vectorize + onnxruntime, in microseconds."""
    import gc

    times = []
    bodies = [e.body for e in examples]
    for b in bodies[:50]:  # warm caches the way a running gateway has them
        clf.predict(extract(b))
    # The training heap (datasets, scikit-learn) makes full GC passes cost milliseconds; a gateway's
    # heap is small. Freezing the long-lived objects measures the classifier, not this process.
    gc.collect()
    gc.freeze()
    try:
        for b in bodies:
            t0 = time.perf_counter()
            clf.predict(extract(b))
            times.append(time.perf_counter() - t0)
    finally:
        gc.unfreeze()
    us = np.array(times) * 1e6
    return {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "cpus": float(os.cpu_count() or 1), "load_avg_1m": round(os.getloadavg()[0], 2)}


def train(
    examples: list[Example],
    out: Path,
    source: dict[str, Any],
    split: Split,
    hash_dim: int = 4096,
    c: float = 1.0,
    labels_meaning: dict[str, str] | None = None,
) -> TrainResult:
    """Fit on the training side, score the held-out side, export, reload with onnxruntime, check parity."""
    import skl2onnx
    import sklearn

    from switchyard.classify.onnx_classifier import OnnxClassifier

    train_ex = [e for e in examples if not e.held_out]
    test_ex = [e for e in examples if e.held_out]
    if len({e.label for e in train_ex}) < 2:
        raise ValueError("training data has only one label; need examples of both simple and complex")
    if not test_ex:
        raise ValueError(f"no held-out examples; need more cases (one group in {split.test_share} is held out)")
    spec = FeatureSpec(hash_dim=hash_dim)
    vec = Vectorizer(spec)
    x_train = vec.matrix([e.features for e in train_ex])
    y_train = np.array([e.label for e in train_ex])
    x_test = vec.matrix([e.features for e in test_ex])
    y_test = np.array([e.label for e in test_ex])
    t0 = time.perf_counter()
    pipe = fit(x_train, y_train, spec, c)
    fit_s = time.perf_counter() - t0
    pred = pipe.predict(x_test)
    scores = score_probabilities(y_test, pipe.predict_proba(x_test)[:, LABELS.index("complex")])
    acc = float((pred == y_test).mean())
    confusion = [[int(((y_test == t) & (pred == p)).sum()) for p in range(len(LABELS))] for t in range(len(LABELS))]
    per_cat: dict[str, tuple[int, float]] = {}
    cats = np.array([e.category for e in test_ex])
    for cat in sorted(set(cats.tolist())):
        m = cats == cat
        per_cat[cat] = (int(m.sum()), float((pred[m] == y_test[m]).mean()))
    trained = {
        **source,
        "estimator": f"hashed text ({hash_dim}) + log1p numeric -> StandardScaler(numeric) -> "
        f"LogisticRegression(C={c})",
        "hash_dim": hash_dim,
        "labels_meaning": labels_meaning or {"simple": "the small pool will do", "complex": "send it to the large pool"},
        "split": {
            **split.record(),
            "groups_train": len({e.group for e in train_ex}),
            "groups_held_out": len({e.group for e in test_ex}),
            "held_out_by": dict(sorted(Counter(str(e.holdout_reason) for e in test_ex).items())),
        },
        "n_train": len(train_ex),
        "n_test": len(test_ex),
        "class_counts_train": {LABELS[k]: v for k, v in sorted(Counter(y_train.tolist()).items())},
        "held_out_accuracy": round(acc, 4),
        "held_out_probability": scores.to_json(),
        "confusion": {"rows_true_cols_pred": list(LABELS), "matrix": confusion},
        "per_category": {k: {"n": n, "accuracy": round(a, 4)} for k, (n, a) in per_cat.items()},
        "fit_seconds": round(fit_s, 2),
        "versions": {
            "scikit-learn": sklearn.__version__,
            "skl2onnx": skl2onnx.__version__,
            "python": platform.python_version(),
        },
    }
    onnx_bytes = to_onnx(pipe, spec)
    save(out, onnx_bytes, spec, trained)
    clf = OnnxClassifier.load(out)
    onnx_p = clf.probabilities_many([e.features for e in test_ex])
    # Both sides see the same float32 rows (the vectorizer's output).
    skl_p = pipe.predict_proba(x_test)
    parity = float(np.abs(onnx_p - skl_p).max())
    lat = _latency(clf, test_ex)
    trained["onnx_vs_sklearn_max_abs_diff"] = float(f"{parity:.3g}")
    trained["latency_us_features_plus_onnx"] = {k: round(v, 2) for k, v in lat.items()}
    write_meta(out, ModelMeta(list(LABELS), spec, INPUT, OUTPUT, sha256_bytes(onnx_bytes), trained))
    return TrainResult(out, len(train_ex), len(test_ex), acc, confusion, per_cat, parity, lat, scores, trained)
