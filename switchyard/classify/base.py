"""The classifier interface: features in, a Label out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from switchyard.classify.features import Features


@dataclass(frozen=True, slots=True)
class Label:
    name: str
    confidence: float
    kind: str = "none"  # which classifier produced it: onnx | llm | none | session | fail-open
    ms: float = 0.0  # time the classifier took


NO_LABEL = Label("", 0.0, "none", 0.0)


class Classifier(Protocol):
    kind: str

    async def classify(self, features: Features, body: dict) -> Label: ...

    async def aclose(self) -> None: ...


class NoClassifier:
    kind = "none"

    async def classify(self, features: Features, body: dict) -> Label:
        return NO_LABEL

    async def aclose(self) -> None:
        return None
