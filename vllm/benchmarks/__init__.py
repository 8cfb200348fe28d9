"""vLLM's benchmarks, as `vllm bench serve|throughput|latency` and as scripts
(benchmarks/benchmark_serving.py, ...): the same flags and reports as vLLM's."""
