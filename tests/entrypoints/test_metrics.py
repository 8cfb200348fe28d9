"""/metrics carries vLLM's current metric names and labels (scraped from the real server)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

ENGINE = {"model_name", "engine"}


def scrape(http) -> dict[str, list]:
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def value(samples, name: str, **labels) -> float:
    return sum(s.value for s in samples.get(name, [])
               if all(s.labels.get(k) == v for k, v in labels.items()))


def test_current_vllm_names_and_labels(http, model_name):
    prompt = "Metrics test: " + "a long shared prefix for the cache " * 12
    before = scrape(http)
    for _ in range(2):  # the second run is served from the prefix cache
        r = http.post("/v1/completions", json={"model": model_name, "prompt": prompt,
                                               "max_tokens": 6, "temperature": 0,
                                               "ignore_eos": True})
        assert r.status_code == 200
    after = scrape(http)
    for name in ("vllm:inter_token_latency_seconds_bucket",
                 "vllm:request_time_per_output_token_seconds_bucket",
                 "vllm:iteration_tokens_total_bucket",
                 "vllm:request_prefill_time_seconds_bucket",
                 "vllm:request_decode_time_seconds_bucket",
                 "vllm:request_inference_time_seconds_bucket",
                 "vllm:request_queue_time_seconds_bucket",
                 "vllm:num_requests_waiting_by_reason",
                 "vllm:prompt_tokens_cached_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:request_success_total", "vllm:prefix_cache_queries_total",
                 "vllm:request_params_n_bucket", "vllm:request_params_max_tokens_bucket",
                 "vllm:request_max_num_generation_tokens_bucket",
                 "vllm:request_num_preemptions_bucket",
                 "vllm:request_prefill_kv_computed_tokens_bucket",
                 "vllm:prompt_tokens_by_source_total"):
        assert name in after, name
        for s in after[name]:
            assert ENGINE <= set(s.labels), (name, s.labels)
            assert s.labels["engine"] == "0"
    assert "vllm:time_per_output_token_seconds_bucket" not in after  # gone upstream
    reasons = {s.labels["finished_reason"] for s in after["vllm:request_success_total"]}
    assert reasons >= {"stop", "length", "abort", "error"}
    assert {s.labels["reason"] for s in after["vllm:num_requests_waiting_by_reason"]} == \
        {"capacity", "deferred"}

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vllm:request_success_total", finished_reason="length") == 2
    assert grew("vllm:request_params_max_tokens_sum") == 2 * 6
    assert grew("vllm:request_params_n_sum") == 2
    assert grew("vllm:request_max_num_generation_tokens_sum") == 2 * 6
    assert grew("vllm:inter_token_latency_seconds_count") >= 2 * 5
    assert grew("vllm:request_time_per_output_token_seconds_count") == 2
    assert grew("vllm:request_prefill_time_seconds_count") == 2
    assert grew("vllm:iteration_tokens_total_count") >= 6
    # Every generated and every prompt token of these requests fell in some iteration.
    assert grew("vllm:iteration_tokens_total_sum") >= grew("vllm:generation_tokens_total")
    assert grew("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == \
        grew("vllm:prompt_tokens_cached_total")
    assert grew("vllm:request_num_preemptions_count") == 2
    info = after["vllm:cache_config_info"][0]
    assert info.value == 1 and info.labels["engine"] == "0" and int(info.labels["block_size"])
    assert grew("vllm:prompt_tokens_cached_total") >= 64
    assert grew("vllm:prompt_tokens_cached_total") <= grew("vllm:prompt_tokens_total") / 2


def test_process_and_python_collectors(http):
    samples = scrape(http)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total",
                 "python_info", "python_gc_collections_total"):
        assert name in samples, name
        assert "engine" not in samples[name][0].labels


def test_n_completions_count_as_n_requests(http, model_name):
    """vLLM runs n > 1 as n child requests and counts each (prompt tokens, TTFT,
    latency, finish reasons); n and the longest completion once per request."""
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    before = scrape(http)
    r = http.post("/v1/completions", json={"model": model_name, "prompt": prompt, "n": 3,
                                           "max_tokens": 4, "temperature": 1.0, "seed": 5,
                                           "ignore_eos": True})
    assert r.status_code == 200, r.text
    after = scrape(http)

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vllm:prompt_tokens_total") == 27
    assert grew("vllm:generation_tokens_total") == 12
    assert grew("vllm:request_success_total", finished_reason="length") == 3
    assert grew("vllm:time_to_first_token_seconds_count") == 3
    assert grew("vllm:e2e_request_latency_seconds_count") == 3
    assert grew("vllm:request_prompt_tokens_sum") == 27
    assert grew("vllm:request_generation_tokens_sum") == 12
    assert grew("vllm:inter_token_latency_seconds_count") == 9
    assert grew("vllm:request_params_n_count") == 1 and grew("vllm:request_params_n_sum") == 3
    assert grew("vllm:request_max_num_generation_tokens_sum") == 4
