"""The CPU backend, all in this package (as Gaudi's in vllm/hpu): what the CPU adds to
the portable torch path of the model, attention and sampling code, which imports
nothing from here.

| module | part |
|---|---|
| `platform.py` | `CpuPlatform`: dtypes, memory, which worker and attention backend; binds the kernels (`bind_custom_ops`) and builds them (`prepare_kernels`) when the worker initializes its device, never when it is constructed |
| `worker.py` | `CPUWorker`: thread binding, KV cache sizing |
| `model_runner.py` | `CPUModelRunner`: token-major layout, native attention metadata |
| `threads.py` | the forward's thread team following the free cores |
| `attention.py` | `CpuAttentionImpl`: torch_sdpa's paged attention plus the native kernels |
| `ops.py` | the custom ops' CPU forwards and the kernel table's CPU entries |
| `loader.py` | builds the C++ kernels once (`-march=native`) and loads them with ctypes |
| `cpu_ops.py`, `prefill_ops.py`, `quant_ops.py` | tensor-level wrappers of the kernels |
| `gemm.py`, `gemm_autotune.py` | bf16 GEMM on weights packed once, per-shape kernel plans |
| `prefill_choice.py`, `autotune.py` | prefill attention kernel by length; the shared measurement cache |
| `fused_decode.py` | a Llama-family decode layer as one native call |
"""
