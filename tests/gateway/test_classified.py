"""The shipped ONNX classifier inside a running gateway: labels route, headers and metrics say so."""

from __future__ import annotations

import openai
from procs import ROOT, http_get, start_gateway, start_upstream

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} things",
                                             "parameters": {"type": "object", "properties": {
                                                 "x": {"type": "integer"}, "y": {"type": "string"}}}}}


def test_onnx_classifier_routes_and_reports(tmp_path):
    (us, surl), (ul, lurl) = start_upstream(tmp_path, "small"), start_upstream(tmp_path, "large")
    policy = tmp_path / "clf.yaml"
    policy.write_text(f"""version: 1
name: clf
pools:
  small: {{model: s, replicas: [{{url: {surl}/v1}}]}}
  large: {{model: l, replicas: [{{url: {lurl}/v1}}]}}
classifier:
  kind: onnx
  path: {ROOT}/classifiers/tool-complexity.onnx
  classify_on: user_turn
  escalate_only: true
session: {{pin: pool}}
routes:
  - {{name: hard, when: {{label: complex, confidence: ">= 0.5"}}, pool: large}}
  - {{name: default, pool: small}}
""")
    gw, url = start_gateway(tmp_path, [policy])
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        easy = c.chat.completions.with_raw_response.create(
            model="auto", tools=[WEATHER], messages=[{"role": "user", "content": "What's the weather in Paris?"}])
        h = easy.headers
        assert h["x-switchyard-classifier"] == "onnx"
        assert h["x-switchyard-label"] in ("simple", "complex")
        assert 0.5 <= float(h["x-switchyard-confidence"]) <= 1.0
        assert float(h["x-switchyard-classifier-ms"]) < 50
        hard = c.chat.completions.with_raw_response.create(
            model="auto", tools=[tool(f"op_{i}") for i in range(6)],
            messages=[{"role": "user", "content": "First compute op_1 for 3 and 4, then op_2 for each of the "
                       "results, and also run op_3 and op_4 in parallel for every city: Paris, Rome and Oslo."}],
            extra_headers={"x-session-id": "agent-1"})
        assert hard.headers["x-switchyard-label"] == "complex"
        assert hard.headers["x-switchyard-pool"] == "large" and hard.headers["x-switchyard-rule"] == "hard"
        # The same session's next user turn, however easy, stays large (escalate_only).
        later = c.chat.completions.with_raw_response.create(
            model="auto", tools=[WEATHER], extra_headers={"x-session-id": "agent-1"},
            messages=[{"role": "user", "content": "First compute op_1 ..."}, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "What's the weather in Paris?"}])
        assert later.headers["x-switchyard-pool"] == "large"
        metrics = http_get(url + "/metrics")[1].decode()
        assert 'switchyard_classifier_seconds_count{kind="onnx"}' in metrics
    finally:
        gw.stop()
        us.stop()
        ul.stop()
