"""Routing quality, docs/replay.md's table: every router against random, on held-out cases only.

    python bench/routing_quality.py                 # starts a SmolLM2 engine for the llm router
    python bench/routing_quality.py --small URL     # an engine already up (e.g. `switchyard up`'s :8101)

From the shipped outcomes (data/outcomes/smollm2-135m.jsonl.gz: SmolLM2's real answers and the
reference pool's, per case) it replays, counterfactually, the routers in policies/routers/
(the outcome router, the shipped complexity classifier, the small-LLM classifier, rules only)
and the shipped default policy, on the cases no trained classifier among them learned from
(`--held-out`), and draws each one's quality curve with RouteLLM's metrics (`--sweep`):

    switchyard replay --from-outcomes data/outcomes/smollm2-135m.jsonl.gz --held-out --sweep \\
        -p policies/routers/outcome.yaml -p policies/routers/complexity.yaml \\
        -p policies/routers/llm.yaml -p policies/routers/rules.yaml -p policies/default.yaml \\
        --out runs/routing-quality

The llm router asks a real SmolLM2 for each label. This script starts one engine for it (the
embedded default's small pool, on a free port) and points a copy of policies/routers/llm.yaml
at it, with the label's time budget raised to 60 s: on a shared 2-core machine a prefill can
wait seconds for a core, and the question here is how good the labels are, not how fast (the
report notes the classifier's time per request). Everything else is deterministic: the same
outcomes give the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.collect_outcomes import ENGINE_ARGS, start, stop  # noqa: E402
from switchyard.datasets import cache_dir  # noqa: E402
from switchyard.replay.gateway import free_port  # noqa: E402

OUTCOMES = ROOT / "data" / "outcomes" / "smollm2-135m.jsonl.gz"
ROUTERS = ["outcome", "complexity", "llm", "rules"]
LLM_TIMEOUT = "60s"


def llm_policy(small: str, folder: Path) -> Path:
    spec = yaml.safe_load((ROOT / "policies" / "routers" / "llm.yaml").read_text(encoding="utf-8"))
    pool = spec["classifier"]["pool"]
    spec["pools"][pool]["replicas"] = [{"url": small.rstrip("/") + "/v1", "name": f"{pool}-0"}]
    spec["classifier"]["timeout"] = LLM_TIMEOUT
    out = folder / "llm.yaml"
    out.write_text("# policies/routers/llm.yaml, pointed at this run's engine (bench/routing_quality.py)\n"
                   + yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return out


def summary_md(report: dict) -> str:
    c = report["comparison"]
    lines = [f"{c['cases']} held-out cases. Small only ({c['small']['label']}): {c['small']['score']:.1f}/100; "
             f"large only ({c['large']['label']}): {c['large']['score']:.1f}/100.", "",
             "| router | APGR [95% CI] | CPT(50%) | CPT(80%) | score at 25% large | score at 50% large | vs random |",
             "|---|---|---|---|---|---|---|"]
    for r in c["routers"]:
        ci = f" [{r['apgr_ci95'][0]:.3f}, {r['apgr_ci95'][1]:.3f}]" if r["apgr_ci95"] else ""
        apgr = "-" if r["apgr"] is None else f"{r['apgr']:.3f}{ci}"
        cpt = ["never" if v is None else f"{100 * v:.1f}%" for v in (r["cpt50"], r["cpt80"])]
        lines.append(f"| {r['name']} | {apgr} | {cpt[0]} | {cpt[1]} | {r['score_at_25']:.1f} | "
                     f"{r['score_at_50']:.1f} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outcomes", type=Path, default=OUTCOMES)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "routing-quality")
    ap.add_argument("--small", help="A running SmolLM2 engine for the llm router (default: start one)")
    args = ap.parse_args()

    engine = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            small = args.small
            if small is None:
                port = free_port()
                log = cache_dir("outcomes") / "routing-quality-engine.log"
                print(f"starting a SmolLM2 engine for the llm router (log: {log})", flush=True)
                engine = start([sys.executable, "-m", "switchyard.cli", "engine", "serve", *ENGINE_ARGS,
                                "--port", str(port)], f"http://127.0.0.1:{port}/health", log)
                small = f"http://127.0.0.1:{port}"
            policies = [ROOT / "policies" / "routers" / f"{r}.yaml" for r in ROUTERS] + [ROOT / "policies" / "default.yaml"]
            policies[ROUTERS.index("llm")] = llm_policy(small, Path(tmp))
            cmd = [sys.executable, "-m", "switchyard.cli", "replay", "--from-outcomes", str(args.outcomes),
                   "--held-out", "--sweep", "--out", str(args.out)]
            for p in policies:
                cmd += ["-p", str(p)]
            rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "COLUMNS": os.environ.get("COLUMNS", "160")}).returncode
        finally:
            stop(engine)
    if rc != 0:
        raise SystemExit(rc)
    md = summary_md(json.loads((args.out / "report.json").read_text(encoding="utf-8")))
    (args.out / "summary.md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
