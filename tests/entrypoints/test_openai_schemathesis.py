"""Property-based fuzzing of every route from the app's own OpenAPI schema: never a 5xx.

Generation is bounded (few examples per route; max_tokens, n and list sizes clamped) so
the run stays within seconds on CPU; the point is odd shapes and values, not long outputs.
"""
from __future__ import annotations

import pytest

from tests.entrypoints.conftest import API_KEY

EXAMPLES_PER_ROUTE = 25
LIMITS = {"max_tokens": 4, "max_completion_tokens": 4, "max_output_tokens": 4, "n": 2,
          "min_tokens": 4, "logprobs": 5, "top_logprobs": 5, "prompt_logprobs": 5}


# Fields refused by design (400) or that usually fail validation when random (grammars,
# tools): positive cases drop them half of the time so that random sampling settings
# reach the engine instead of stopping at the refusal.
REFUSED = ("model", "response_format", "use_beam_search", "length_penalty", "best_of",
           "priority", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
           "structured_outputs", "logits_processors", "bad_words", "cache_salt",
           "kv_transfer_params", "vllm_xargs", "suffix", "prompt_embeds", "tools",
           "tool_choice", "functions", "function_call", "audio", "modalities", "prediction",
           "documents", "mm_processor_kwargs", "chat_template", "chat_template_kwargs",
           "continue_final_message", "request_id")


def bound(body, drop_refused: bool):
    """Clamp costly knobs of a generated body; leave wrong types alone (negative cases)."""
    if not isinstance(body, dict):
        return
    if drop_refused:
        for key in REFUSED:
            body.pop(key, None)
    for key, limit in LIMITS.items():
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            body[key] = limit
    if "messages" in body or "prompt" in body:
        for key in ("max_tokens", "max_completion_tokens"):
            if body.get(key) is None:
                body[key] = LIMITS[key]
    if "input" in body and body.get("max_output_tokens") is None:  # /v1/responses
        body["max_output_tokens"] = LIMITS["max_output_tokens"]
    for key in ("prompt", "messages", "tokens", "input"):
        if isinstance(body.get(key), list):
            body[key] = body[key][:4]
    if isinstance(body.get("prompt"), str):
        body["prompt"] = body["prompt"][:2000]


def test_no_server_errors(server, http):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings

    schema = schemathesis.openapi.from_dict(http.get("/openapi.json").json())
    headers = {"Authorization": f"Bearer {API_KEY}"}
    failures: list[str] = []
    statuses: dict[int, int] = {}
    operations = [r.ok() for r in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert {"POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize",
            "POST /detokenize", "GET /v1/models"} <= labels

    for op in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        # Negative cases need a declared JSON body to break (/ping, /invocations and
        # /v1/responses/{id}/cancel declare none; any string is a valid id).
        if op.method.upper() == "POST" and op.get_request_payload_content_types():
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:
            @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None,
                      derandomize=True, phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                positive = mode == schemathesis.GenerationMode.POSITIVE
                bound(case.body, drop_refused=positive and len(str(case.body)) % 2 == 0)
                response = case.call(base_url=server.url, headers=headers, timeout=120)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    failures.append(f"{op.label} {mode}: {response.status_code} "
                                    f"{response.text[:300]} <- {str(case.body)[:300]}")

            run()
    print(f"\n[schemathesis] responses by status: {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(failures[:10])
    assert statuses.get(200, 0) > 20, "fuzzing never got a request through"
    assert http.get("/health").status_code == 200
