"""`switchyard classifier ...` (owned by the classifier work; lazy imports keep start-up fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

classifier_app = typer.Typer(no_args_is_help=True)

SHIPPED = "classifiers/tool-complexity.onnx"


def _die(msg: str, code: int = 1) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _load(model: str):  # -> OnnxClassifier
    from switchyard.classify.model_file import resolve_model_path
    from switchyard.classify.onnx_classifier import OnnxClassifier
    from switchyard.errors import ClassifierLoadError

    try:
        return OnnxClassifier.load(resolve_model_path(model, Path.cwd(), None))
    except ClassifierLoadError as e:
        _die(str(e))


def _need_train_extra() -> None:
    try:
        import skl2onnx  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError:
        _die("training needs scikit-learn and skl2onnx: pip install 'switchyard[train]'")


def _summary(r) -> None:  # r: TrainResult
    typer.echo(f"wrote {r.path} and {r.path.with_suffix('.json').name}")
    held = r.trained["split"]["held_out_by"]
    typer.echo(f"train {r.n_train}, held out {r.n_test} ("
               + ", ".join(f"{k}: {v}" for k, v in held.items()) + f"): held-out accuracy {r.accuracy:.4f}")
    s = r.scores
    auc = "-" if s.roc_auc is None else f"{s.roc_auc:.4f}"
    typer.echo(f"held-out P(complex): ROC AUC {auc}, Brier {s.brier:.4f} (base rate alone {s.brier_base_rate:.4f})")
    typer.echo(f"confusion (rows true simple/complex, cols predicted): {r.confusion}")
    typer.echo(f"ONNX vs scikit-learn max |diff| {r.parity_max_abs_diff:.2g}")
    typer.echo(f"latency features+ONNX: p50 {r.latency_us['p50']:.1f} us, p99 {r.latency_us['p99']:.1f} us")


def _split(cases: list[tuple[str, dict]], suites: list[str], test_share: int):  # -> Split
    from switchyard.classify.split import Split, SplitError

    try:
        return Split.build(cases, suites, test_share)
    except SplitError as e:
        _die(str(e))


@classifier_app.command()
def train(
    out: Path = typer.Option(None, help=f"Model file to write (default: {SHIPPED}, or "
                             "classifiers/from-outcomes.onnx with --outcomes); NAME.json and NAME.md go beside it"),
    outcomes: Path = typer.Option(None, help="Per-case outcomes JSONL, .gz too (from `switchyard replay --pool "
                                  "small --outcomes`): learn 'the small pool will fail' instead of BFCL categories"),
    small_pool: str = typer.Option("small", help="Outcomes: the pool whose failures mean `complex`"),
    large_pool: str = typer.Option("large", help="Outcomes: the large pool's name"),
    require_large_correct: bool = typer.Option(False, help="Outcomes: `complex` only where large got it right"),
    hold_out_suite: list[str] = typer.Option(
        ["tooluse-92"], "--hold-out-suite", help="Never train on this replay suite (repeat for several): a "
        "shipped suite's name, bfcl:CATEGORY[:N], a suite .json or a .jsonl trace; the groups of its cases "
        "are held out whole"),
    test_share: int = typer.Option(5, help="Of the other groups, hold out one in this many"),
    hash_dim: int = typer.Option(4096, help="Hashed text buckets (a power of two)"),
    c: float = typer.Option(1.0, "--c", help="Inverse regularisation strength of the logistic regression"),
    card: bool = typer.Option(True, help="Write the model card NAME.md"),
) -> None:
    """Train the request classifier and export it to ONNX (reproduces the shipped model by default)."""
    _need_train_extra()
    from switchyard.classify import card as card_mod
    from switchyard.classify.train import bfcl_examples, example
    from switchyard.classify.train import train as run_train
    from switchyard.datasets import BFCL

    if hash_dim < 2 or hash_dim & (hash_dim - 1):
        _die("--hash-dim must be a power of two")
    if test_share < 2:
        _die("--test-share must be at least 2")
    suites_opt = "".join(f" --hold-out-suite {s}" for s in hold_out_suite) if hold_out_suite != ["tooluse-92"] else ""
    if outcomes is None:
        out = out or Path(SHIPPED)
        split = _split([], hold_out_suite, test_share)
        examples = bfcl_examples(split)
        source = {"data": f"BFCL v4 ({BFCL.package} {BFCL.version})", "target": "BFCL category (see card)",
                  "command": "switchyard classifier train"}
        kind = card_mod.BFCL_KIND
        data_section = card_mod.BFCL_DATA
        command = f"switchyard classifier train --out {out}{suites_opt}"
    else:
        from switchyard.classify.outcomes import OutcomesError, label_cases, read_outcomes

        out = out or Path("classifiers/from-outcomes.onnx")
        try:
            cases = label_cases(read_outcomes(outcomes), small_pool, large_pool, require_large_correct)
        except OutcomesError as e:
            _die(str(e))
        split = _split([(cid, body) for cid, body, _, _ in cases], hold_out_suite, test_share)
        examples = [example(split, cid, cat or "(no category)", fails, body) for cid, body, fails, cat in cases]
        target = f"pool {small_pool!r} answered wrongly" + (f" and {large_pool!r} rightly" if require_large_correct else "")
        source = {"data": f"outcomes {outcomes.name}", "target": target,
                  "command": f"switchyard classifier train --outcomes {outcomes}"}
        kind = card_mod.OUTCOMES_KIND
        data_section = card_mod.outcomes_data(outcomes.name, len(examples), sum(e.label for e in examples),
                                              small_pool, target)
        command = f"switchyard classifier train --outcomes {outcomes} --out {out}{suites_opt}"
    try:
        r = run_train(examples, out, source, split, hash_dim=hash_dim, c=c, labels_meaning=kind.labels_meaning)
    except ValueError as e:
        _die(str(e))
    _summary(r)
    if card:
        p = card_mod.write(out, card_mod.render(r, r.trained, data_section, command, kind))
        typer.echo(f"wrote {p}")


@classifier_app.command("eval")
def evaluate(
    model: str = typer.Option(SHIPPED, help="Model file (.onnx with its .json)"),
    outcomes: Path = typer.Option(None, help="Score on an outcomes file (small pool failures) instead of BFCL"),
    small_pool: str = typer.Option("small"),
    all_cases: bool = typer.Option(False, "--all", help="Score every case, not only the model's held-out split"),
) -> None:
    """Accuracy, ROC AUC, Brier score and reliability of a model on its held-out split (BFCL or outcomes)."""
    import numpy as np

    from switchyard.classify.features import extract
    from switchyard.classify.split import Split, SplitError

    clf = _load(model)
    if outcomes is None:
        from switchyard.classify.bfcl import load_cases
        from switchyard.datasets import bfcl_zip

        with bfcl_zip() as zf:
            rows = [(c.id, c.body, c.label, c.category) for c in load_cases(zf)]
    else:
        from switchyard.classify.outcomes import OutcomesError, label_cases, read_outcomes

        try:
            labelled = label_cases(read_outcomes(outcomes), small_pool)
        except OutcomesError as e:
            _die(str(e))
        rows = [(cid, b, "complex" if f else "simple", c) for cid, b, f, c in labelled]
    if not all_cases:
        try:
            split = Split.from_record(clf.meta.trained.get("split"), [(cid, b) for cid, b, _, _ in rows])
        except SplitError as e:
            _die(f"{model}: {e} (or pass --all)")
        rows = [r for r in rows if split.held_out(r[0])]
    if not rows:
        _die("no cases to score")
    labels = list(clf.labels)
    probs = clf.probabilities_many([extract(b) for _, b, _, _ in rows])
    pred = np.array([labels[k] for k in probs.argmax(axis=1)])
    true = np.array([t for _, _, t, _ in rows])
    which = "every case" if all_cases else "held out from its training"
    typer.echo(f"{model}: {len(rows)} cases ({which}), accuracy {(pred == true).mean():.4f}")
    typer.echo("confusion (rows true, cols predicted): " + ", ".join(labels))
    for t in labels:
        typer.echo(f"  {t:>10}: " + " ".join(f"{int(((true == t) & (pred == p)).sum()):6d}" for p in labels))
    if len(labels) == 2:
        _need_train_extra()
        from switchyard.classify.scores import reliability_rows, score_probabilities

        pos = labels[1]
        s = score_probabilities(true == pos, probs[:, 1])
        auc = "-" if s.roc_auc is None else f"{s.roc_auc:.4f}"
        typer.echo(f"P({pos}): ROC AUC {auc}, Brier {s.brier:.4f} (base rate alone {s.brier_base_rate:.4f})")
        for row in reliability_rows(s):
            typer.echo("  " + "  ".join(f"{c:>14}" for c in row))


@classifier_app.command()
def calibrate(
    target_large_share: float = typer.Option(..., help="Share of requests to send to the large pool, 0..1"),
    model: str = typer.Option(SHIPPED, help="Model file (.onnx with its .json)"),
    trace: Path = typer.Option(None, help="JSONL of OpenAI chat bodies (or outcomes records); default: BFCL"),
    label: str = typer.Option("complex", help="The label that means 'large pool'"),
    large_pool: str = typer.Option("large", help="Pool name for the printed rules"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text"),
) -> None:
    """Find the confidence threshold that sends the target share of a trace to the large pool."""
    from switchyard.classify.calibrate import calibrate as run_calibrate
    from switchyard.classify.calibrate import read_trace

    clf = _load(model)
    if trace is None:
        from switchyard.classify.bfcl import load_cases
        from switchyard.datasets import bfcl_zip

        with bfcl_zip() as zf:
            bodies = [c.body for c in load_cases(zf)]
        source = "BFCL v4 (all cases)"
    else:
        try:
            bodies = read_trace(trace)
        except (OSError, EOFError, ValueError) as e:
            _die(str(e))
        source = str(trace)
    try:
        cal = run_calibrate(clf, bodies, target_large_share, label)
    except ValueError as e:
        _die(str(e))
    if as_json:
        typer.echo(json.dumps({"threshold": cal.threshold, "share": cal.share, "requests": cal.n,
                               "label": label, "trace": source}))
        return
    typer.echo(f"{source}: {cal.n} requests")
    typer.echo(f"P({label}) >= {cal.threshold:.4f} sends {cal.share:.1%} to {large_pool} "
               f"(target {target_large_share:.1%})")
    typer.echo("policy routes (first match wins; put them before the default route):")
    typer.echo(cal.rules_yaml(large_pool))


@classifier_app.command()
def predict(
    request: Path = typer.Argument(..., help="OpenAI chat body as JSON ('-' reads stdin)"),
    model: str = typer.Option(SHIPPED, help="Model file (.onnx with its .json)"),
) -> None:
    """Classify one request and print the label, confidence and time."""
    from switchyard.classify.features import extract

    clf = _load(model)
    try:
        body = json.loads(sys.stdin.read() if str(request) == "-" else request.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        _die(f"cannot read the request: {e}")
    if not isinstance(body, dict):
        _die("the request must be a JSON object")
    lab = clf.predict(extract(body))
    typer.echo(json.dumps({"label": lab.name, "confidence": round(lab.confidence, 4), "ms": round(lab.ms, 4)}))
