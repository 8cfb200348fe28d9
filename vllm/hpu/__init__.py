"""The Intel Gaudi (HPU) backend, all in this package.

Gaudi compiles a graph per input shape, so everything here serves one idea: run
the model only on shapes chosen in advance (buckets), compile them all before
serving (warmup), and never compile while serving. The parts, in the order a step
meets them:

| module | part |
|---|---|
| `platform.py` | `HpuPlatform`: device, memory, which worker and attention backend |
| `plugin.py` | the HPU build's entry points (Gaudi's runtime settings, op binding) |
| `worker.py` | `HPUWorker`: device init, memory profile, KV cache sizing, graph budget |
| `model_runner.py` | `HPUModelRunner`: a scheduler step as bucketed passes |
| `bucketing.py` | prompt and decode bucket grids; a batch's bucket |
| `input_prep.py` | padded `HPUBatch`es (ids, positions, flat paged-attention metadata) |
| `execution.py` | execution modes: HPU graphs, lazy, torch.compile, eager |
| `warmup.py` | one pass per bucket before serving, graph memory accounting |
| `compile_tracker.py` | counts compiles after warmup, by pass signature |
| `graph_keys.py` | what a graph is keyed by (input signature, baked constants) |
| `defragmenter.py` | compacts KV blocks so decode buckets stay small |
| `sampling.py` | fixed-shape sampling metadata padded to the bucket |
| `attention.py`, `paged_attn.py` | FusedSDPA prefill, flat paged attention decode, KV cache |
| `ops.py` | Gaudi's kernels bound to the custom ops (RMSNorm, rotary) |
| `profiler.py`, `log.py` | the HPU profiler and vllm-gaudi's log lines |
| `habana/` | the `habana_frameworks` shim: the real modules on Gaudi, plain-torch stand-ins off it (`VLLM_USE_FAKE_HPU=1`), reached only through `vllm.hpu.habana` |

Importing this package imports nothing: a CPU process that never builds the HPU
platform never loads any of it (tests/hpu/test_install.py checks that).
"""
