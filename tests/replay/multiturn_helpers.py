"""BFCL's own multi-turn checker, imported from the extracted bfcl-eval wheel (tests only), and a
reference pool served in-process for session tests."""

from __future__ import annotations

import ast
import itertools
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

from switchyard.replay.multiturn.session import SessionRecord

_MEMBERS = ("bfcl_eval/__init__.py", "bfcl_eval/constants/__init__.py",
            "bfcl_eval/constants/executable_backend_config.py", "bfcl_eval/eval_checker/__init__.py",
            "bfcl_eval/eval_checker/multi_turn_eval/", "bfcl_eval/model_handler/utils.py")
_names = itertools.count()


class BfclChecker:
    """multi_turn_checker and the decoding step of BFCL's eval runner, from the wheel's files."""

    def __init__(self, wheel: zipfile.ZipFile, into: Path):
        for n in wheel.namelist():
            if n.startswith(_MEMBERS) and n.endswith(".py"):
                wheel.extract(n, into)
        sys.path.insert(0, str(into))
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

        self.checker = multi_turn_checker.multi_turn_checker
        self.is_empty = multi_turn_utils.is_empty_execute_response
        # model_handler/utils.py imports half of BFCL; take only its convert_to_function_call.
        src = (into / "bfcl_eval/model_handler/utils.py").read_text()
        fn = next(n for n in ast.parse(src).body
                  if isinstance(n, ast.FunctionDef) and n.name == "convert_to_function_call")
        ns: dict[str, Any] = {"json": json}
        exec(compile(ast.Module([fn], []), "bfcl_eval/model_handler/utils.py", "exec"), ns)
        self.convert = ns["convert_to_function_call"]

    def verdict(self, entry: dict[str, Any], ground_truth: list[list[str]], rec: SessionRecord) -> dict[str, Any]:
        """What BFCL's eval runner (_evaluate_single_multi_turn_entry) says of the recorded session."""
        raw = [[s.response for s in t.steps if s.http_status == 200] for t in rec.turns]
        if rec.error:  # a request the server refused: no BFCL result file would hold this session
            return {"valid": False, "error_type": "session_error"}
        if len(raw) != len(ground_truth):
            return {"valid": False, "error_type": "multi_turn:force_terminated"}
        decoded = []
        for turn in raw:
            steps = []
            for item in turn:
                try:
                    d = self.convert(item)
                    if self.is_empty(d):
                        continue
                    steps.append(d)
                except Exception:
                    continue
            decoded.append(steps)
        # Its environments live in module globals keyed by model name: a fresh name per check.
        return self.checker(decoded, ground_truth, json.loads(json.dumps(entry)), entry["id"].rsplit("_", 1)[0],
                            f"agreement_{next(_names)}")
