"""`switchyard replay`: tool-use traces through routing policies, scored, with the split they buy.

sources.py (tooluse-92, bfcl:CATEGORY, JSONL) -> cases.Case -> runner.py (live through a
gateway, dry run, or counterfactual from outcomes files) -> results -> report.py (table,
report.json, report.html + plots.py). scoring.py holds BFCL's AST rules, written here;
record.py is what `switchyard serve --record` writes traces with.
"""
