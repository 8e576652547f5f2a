"""The ONNX classifier: parity with scikit-learn, the shipped model's accuracy, load errors, speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from classifykit import ROOT, SHIPPED

from switchyard.classify.base import Label
from switchyard.classify.bfcl import Case
from switchyard.classify.features import extract
from switchyard.classify.onnx_classifier import OnnxClassifier
from switchyard.classify.split import Split
from switchyard.classify.vectorize import FeatureSpec, Vectorizer
from switchyard.errors import ClassifierLoadError
from switchyard.policy.classifier import build_classifier
from switchyard.policy.schema import ClassifierSpec

# The shipped model scores 0.863 on the held-out split (model card: the replay suite's groups and
# one group in five, near-duplicates kept together); this floor leaves room for retraining noise
# while still failing a broken feature pipeline or label mapping.
ACCURACY_FLOOR = 0.83


def test_onnx_probabilities_equal_sklearn(tmp_path: Path, bfcl_cases: list[Case], shipped_split: Split) -> None:
    pytest.importorskip("sklearn")
    from switchyard.classify.train import LABELS, fit, save, to_onnx

    spec = FeatureSpec(hash_dim=1024)
    vec = Vectorizer(spec)
    train = [c for c in bfcl_cases[::3] if not shipped_split.held_out(c.id)]
    test = [c for c in bfcl_cases if shipped_split.held_out(c.id)]
    pipe = fit(vec.matrix([extract(c.body) for c in train]), np.array([LABELS.index(c.label) for c in train]), spec)
    path = tmp_path / "parity.onnx"
    save(path, to_onnx(pipe, spec), spec, {"purpose": "parity test"})
    clf = OnnxClassifier.load(path)
    # Odd requests too: empty, huge, non-ASCII, tool loops.
    extra = [{}, {"messages": [{"role": "user", "content": "Ünïcødé ✓ 東京 and Zürich, both?"}]},
             {"messages": [{"role": "user", "content": "x " * 5000}], "tools": [{"type": "function"}] * 40}]
    feats = [extract(c.body) for c in test] + [extract(b) for b in extra]
    onnx_one = np.stack([clf.probabilities(f) for f in feats])  # the serving path: one row per call
    onnx_batch = clf.probabilities_many(feats)
    skl = pipe.predict_proba(vec.matrix(feats))
    assert onnx_one.shape == skl.shape == (len(feats), 2)
    assert np.abs(onnx_one - skl).max() < 1e-4
    assert np.abs(onnx_batch - skl).max() < 1e-4
    assert (onnx_one.argmax(1) == pipe.predict(vec.matrix(feats))).all()


def test_shipped_model_held_out_accuracy(bfcl_cases: list[Case], shipped_split: Split) -> None:
    clf = OnnxClassifier.load(SHIPPED, expect_labels=["simple", "complex"])
    held = [c for c in bfcl_cases if shipped_split.held_out(c.id)]
    assert len(held) > 500
    probs = clf.probabilities_many([extract(c.body) for c in held])
    pred = [clf.labels[k] for k in probs.argmax(1)]
    acc = float(np.mean([p == c.label for p, c in zip(pred, held, strict=True)]))
    assert acc >= ACCURACY_FLOOR, f"held-out accuracy {acc:.4f} below the floor {ACCURACY_FLOOR}"
    recorded = json.loads(SHIPPED.with_suffix(".json").read_text())["trained"]["held_out_accuracy"]
    assert abs(acc - recorded) < 1e-3  # the card's figure is what the file does


async def test_build_shipped_model_from_any_policy_folder(tmp_path: Path) -> None:
    clf = build_classifier(ClassifierSpec(kind="onnx", path="classifiers/tool-complexity.onnx"), tmp_path, None)
    body = {"messages": [{"role": "user", "content": "Get the weather in Paris, London and Tokyo, and "
                          "book a table for each city."}],
            "tools": [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                      for n in ("weather", "book", "search", "email")]}
    lab = await clf.classify(extract(body), body)
    assert isinstance(lab, Label) and lab.kind == "onnx"
    assert lab.name in ("simple", "complex") and 0.5 <= lab.confidence <= 1.0 and lab.ms > 0
    await clf.aclose()


def test_path_relative_to_the_policy_folder_and_absolute(model_copy: Path) -> None:
    rel = build_classifier(ClassifierSpec(kind="onnx", path="m.onnx"), model_copy.parent, None)
    absolute = build_classifier(ClassifierSpec(kind="onnx", path=str(model_copy)), Path("/nonexistent"), None,
                                [model_copy.parent])
    assert rel.kind == absolute.kind == "onnx"


def test_a_model_outside_the_allowed_folders_is_refused_like_a_missing_one(model_copy: Path, tmp_path: Path) -> None:
    """A policy cannot load, or learn of, files outside its folder, classifiers/ and --classifier-dir."""
    elsewhere = tmp_path / "policies"
    elsewhere.mkdir()
    errors = []
    for path in (str(model_copy), "../m.onnx", "/etc/passwd", "/no/such.onnx"):
        with pytest.raises(ClassifierLoadError) as e:
            build_classifier(ClassifierSpec(kind="onnx", path=path), elsewhere, None)
        errors.append(str(e.value).replace(repr(path), "PATH"))
    assert len(set(errors)) == 1 and "not found or not readable" in errors[0]


def test_serving_does_not_import_sklearn() -> None:
    code = (
        "import sys; sys.modules['sklearn'] = None; sys.modules['skl2onnx'] = None\n"
        "import asyncio, pathlib\n"
        "from switchyard.policy.classifier import build_classifier\n"
        "from switchyard.classify.features import extract\n"
        "from switchyard.policy.schema import ClassifierSpec\n"
        "c = build_classifier(ClassifierSpec(kind='onnx', path='classifiers/tool-complexity.onnx'), "
        "pathlib.Path('/'), None)\n"
        "b = {'messages': [{'role': 'user', 'content': 'hi'}]}\n"
        "print(asyncio.run(c.classify(extract(b), b)).kind)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "onnx"


def _load(path: Path, labels: list[str] | None = None) -> str:
    spec = ClassifierSpec(kind="onnx", path=str(path), labels=labels or ["simple", "complex"])
    with pytest.raises(ClassifierLoadError) as e:
        build_classifier(spec, path.parent, None)
    return str(e.value)


def _edit_sidecar(model: Path, **changes: object) -> None:
    side = model.with_suffix(".json")
    d = json.loads(side.read_text())
    for key, value in changes.items():
        if key.startswith("features."):
            d["features"][key.split(".", 1)[1]] = value
        else:
            d[key] = value
    side.write_text(json.dumps(d))


def test_missing_model(tmp_path: Path) -> None:
    msg = _load(tmp_path / "nope.onnx")
    assert "'" + str(tmp_path / "nope.onnx") + "': not found" in msg


def test_missing_sidecar(model_copy: Path) -> None:
    model_copy.with_suffix(".json").unlink()
    assert "sidecar m.json is missing" in _load(model_copy)


def test_truncated_model_fails_its_checksum(model_copy: Path) -> None:
    data = model_copy.read_bytes()
    model_copy.write_bytes(data[: len(data) // 2])
    msg = _load(model_copy)
    assert str(model_copy) in msg and "does not match its sidecar" in msg


def test_garbage_model_with_matching_checksum(model_copy: Path) -> None:
    import hashlib

    junk = b"this is not an onnx protobuf" * 10
    model_copy.write_bytes(junk)
    _edit_sidecar(model_copy, sha256=hashlib.sha256(junk).hexdigest())
    assert "onnxruntime cannot load the model" in _load(model_copy)


def test_sidecar_not_json_and_wrong_versions(model_copy: Path) -> None:
    side = model_copy.with_suffix(".json")
    good = side.read_text()
    side.write_text("{ not json")
    assert "m.json: not valid JSON" in _load(model_copy)
    side.write_text(good)
    _edit_sidecar(model_copy, format_version=99)
    assert "format_version 99" in _load(model_copy)
    side.write_text(good)
    _edit_sidecar(model_copy, **{"features.version": 0})
    assert "feature version 0" in _load(model_copy)


def test_width_mismatch_between_sidecar_and_model(model_copy: Path) -> None:
    _edit_sidecar(model_copy, **{"features.hash_dim": 2048})
    assert "model takes 4111 features, its sidecar's feature spec makes 2063" in _load(model_copy)


def test_labels_mismatch_with_policy(model_copy: Path) -> None:
    msg = _load(model_copy, labels=["easy", "hard"])
    assert "model labels ['simple', 'complex'] do not match the policy's classifier.labels ['easy', 'hard']" in msg


def test_policy_load_error_and_old_policy_keeps_serving(tmp_path: Path, model_copy: Path) -> None:
    from switchyard.gateway.gateway import Gateway
    from switchyard.policy.loader import PolicyError
    from switchyard.state.memory import MemoryStore

    policy = tmp_path / "p.yaml"
    text = (
        "version: 1\npools:\n  small: {model: s, replicas: [{url: 'http://127.0.0.1:9/v1'}]}\n"
        "  large: {model: l, replicas: [{url: 'http://127.0.0.1:10/v1'}]}\n"
        "classifier:\n  kind: onnx\n  path: m.onnx\n"
        "routes:\n  - {name: hard, when: {label: complex}, pool: large}\n  - {name: default, pool: small}\n"
    )
    policy.write_text(text)
    gw = Gateway(state=MemoryStore())
    gw.load([policy])
    old = gw.policies()[0].classifier
    model_copy.write_bytes(b"corrupt")
    st = asyncio.run(gw.store.reload_file(policy))
    assert not st.ok and "classifier:" in st.error and "does not match its sidecar" in st.error
    assert "p.yaml:5" in st.error  # the line of the classifier block
    assert gw.policies()[0].classifier is old
    with pytest.raises(PolicyError):
        Gateway(state=MemoryStore()).load([policy])


def test_latency_sub_millisecond_with_features(bfcl_cases: list[Case]) -> None:
    clf = OnnxClassifier.load(SHIPPED)
    bodies = [c.body for c in bfcl_cases[::4]]
    for b in bodies[:50]:
        clf.predict(extract(b))
    times = []
    for b in bodies:
        t0 = time.perf_counter()
        clf.predict(extract(b))
        times.append(time.perf_counter() - t0)
    p50 = float(np.percentile(times, 50)) * 1000
    # The bench measures the 0.15 ms target on a quiet machine; here: sub-ms under a shared CI load.
    assert p50 < 1.0, f"p50 {p50:.3f} ms"
