"""`replay --held-out`: keep only the cases no policy's classifier was trained on.

A trained classifier's sidecar records its split (classify/split.py); rebuilt here over the
replayed cases, it says which of them the model held out. With several policies, a case is kept
when every one of their trained classifiers held it out, so the routers are compared on the
same cases and none on its own training data. Classifiers without training data (`kind: llm`,
`kind: none`) impose nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.classify.model_file import read_meta, resolve_model_path
from switchyard.classify.split import Split, SplitError
from switchyard.errors import ClassifierLoadError
from switchyard.policy.loader import load_policy


class HeldOutError(ValueError):
    pass


@dataclass(frozen=True)
class TrainedModel:
    policy: str
    model: Path
    record: dict[str, Any]


def trained_models(policy_files: Iterable[Path]) -> list[TrainedModel]:
    """The trained classifiers the policies use, with their split records."""
    out = []
    for pf in policy_files:
        spec = load_policy(pf)
        if spec.classifier.kind != "onnx" or spec.classifier.path is None:
            continue
        try:
            model = resolve_model_path(spec.classifier.path, Path(pf).parent, None)
            record = read_meta(model).trained.get("split")
        except ClassifierLoadError as e:
            raise HeldOutError(f"{pf}: {e}") from None
        if not isinstance(record, dict):
            raise HeldOutError(f"{pf}: {model.name} records no training split; retrain it with "
                               "`switchyard classifier train` to replay --held-out")
        out.append(TrainedModel(spec.name or Path(pf).stem, model, record))
    return out


def held_out_filter(policy_files: Iterable[Path], cases: list[tuple[str, dict[str, Any]]]
                    ) -> tuple[Callable[[str], bool], str]:
    """(keep(case id), a sentence saying what was kept) for these cases (id, request body)."""
    models = trained_models(policy_files)
    if not models:
        raise HeldOutError("--held-out: none of the policies uses a trained classifier (kind onnx), "
                           "so no case is anyone's training data; leave --held-out out")
    try:
        splits = [Split.from_record(m.record, cases) for m in models]
    except SplitError as e:
        raise HeldOutError(f"--held-out: {e}") from None

    def keep(case_id: str) -> bool:
        return all(s.held_out(case_id) for s in splits)

    names = ", ".join(sorted({m.model.name for m in models}))
    kept = sum(keep(cid) for cid, _ in cases)
    return keep, f"{kept} of {len(cases)} cases: those held out from the training of {names}"
