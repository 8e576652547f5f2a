"""The in-process ONNX classifier: loaded once, one onnxruntime call per request, no scikit-learn."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from switchyard.classify.base import Label
from switchyard.classify.features import Features
from switchyard.classify.model_file import ModelMeta, read_meta, sha256_bytes
from switchyard.classify.vectorize import Vectorizer
from switchyard.errors import ClassifierLoadError


class OnnxClassifier:
    kind = "onnx"

    def __init__(self, path: Path, meta: ModelMeta, session: object) -> None:
        self.path = path
        self.meta = meta
        self.labels = meta.labels
        self._session = session
        self._vec = Vectorizer(meta.features)
        self._feed = meta.input_name
        self._fetch = [meta.output_name]
        self.calls = 0

    @classmethod
    def load(cls, path: Path, expect_labels: list[str] | None = None) -> OnnxClassifier:
        """Load and check `path` + its sidecar; ClassifierLoadError says what is wrong and where."""
        import onnxruntime as ort  # a core dependency; imported here to keep `import switchyard` light

        if not path.is_file():
            raise ClassifierLoadError(f"{path}: model file not found")
        meta = read_meta(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ClassifierLoadError(f"{path}: cannot read the model file ({e.strerror or e})") from None
        digest = sha256_bytes(data)
        if digest != meta.sha256:
            raise ClassifierLoadError(
                f"{path}: sha256 {digest[:12]}... does not match its sidecar's {meta.sha256[:12]}... "
                "(the .onnx file is corrupt or was replaced without its .json; retrain or restore both)"
            )
        opts = ort.SessionOptions()
        # One request at a time is microseconds of work: threads would only add hand-off latency.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            session = ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for bad graphs
            raise ClassifierLoadError(f"{path}: onnxruntime cannot load the model: {e}") from None
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = {o.name: o for o in session.get_outputs()}
        if meta.input_name not in inputs or len(inputs) != 1:
            raise ClassifierLoadError(
                f"{path}: model inputs {sorted(inputs)} do not match the sidecar's input {meta.input_name!r}"
            )
        width = inputs[meta.input_name].shape[-1]
        if width != meta.features.width:
            raise ClassifierLoadError(
                f"{path}: model takes {width} features, its sidecar's feature spec makes {meta.features.width}"
            )
        if meta.output_name not in outputs:
            raise ClassifierLoadError(
                f"{path}: model has no output {meta.output_name!r} (outputs: {sorted(outputs)})"
            )
        if expect_labels is not None and sorted(expect_labels) != sorted(meta.labels):
            raise ClassifierLoadError(
                f"{path}: model labels {meta.labels} do not match the policy's classifier.labels {expect_labels}"
            )
        clf = cls(path, meta, session)
        try:
            probs = clf.probabilities(Features())  # one real inference proves the graph runs
        except Exception as e:
            raise ClassifierLoadError(f"{path}: model fails on a test input: {e}") from None
        if probs.shape != (len(meta.labels),):
            raise ClassifierLoadError(
                f"{path}: model returns {probs.shape[0]} probabilities for {len(meta.labels)} labels"
            )
        return clf

    def probabilities(self, features: Features) -> np.ndarray:
        x = self._vec.row(features)
        return self._session.run(self._fetch, {self._feed: x})[0][0]  # type: ignore[attr-defined]

    def probabilities_many(self, features: list[Features]) -> np.ndarray:
        x = self._vec.matrix(features)
        return self._session.run(self._fetch, {self._feed: x})[0]  # type: ignore[attr-defined]

    def predict(self, features: Features) -> Label:
        t0 = time.perf_counter()
        probs = self.probabilities(features)
        k = int(probs.argmax())
        self.calls += 1
        return Label(self.labels[k], float(probs[k]), self.kind, (time.perf_counter() - t0) * 1000.0)

    async def classify(self, features: Features, body: dict) -> Label:
        # Tens of microseconds: cheaper inline than any hand-off to a thread.
        return self.predict(features)

    async def aclose(self) -> None:
        return None
