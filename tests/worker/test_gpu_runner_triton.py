"""The CUDA runner with the Triton backend and (stand-in) CUDA graphs, end to end on CPU.

The engine runs its CUDA model runner on device="cpu": the Triton kernels through
Triton's interpreter, graphs as `EagerGraph` (recorded at capture, re-run on replay
over the same static buffers). So what a GPU run relies on is checked here: the
metadata, decodes and prefills in one kernel call, padded replays, chunked prefill
and prefix-cache hits, against transformers' greedy tokens on the same weights.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from tests.engine.conftest import hf_greedy  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.cpu.platform import CpuPlatform  # noqa: E402
from vllm.platforms.cuda import TRITON_ATTN  # noqa: E402
from vllm.cpu import worker as cpu_worker  # noqa: E402
from vllm.worker.cuda_graphs import EagerGraph  # noqa: E402
from vllm.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

NEW_TOKENS = 8


@pytest.fixture
def cuda_runner_on_cpu(monkeypatch):
    """The CPU worker builds the CUDA runner (on the CPU) and captures its graphs after
    the KV cache, as the GPU worker does; the CPU platform offers TRITON_ATTN and keeps
    the graph sizes, as the CUDA platform does."""
    monkeypatch.setattr(CpuPlatform, "attn_backends",
                        {**CpuPlatform.attn_backends, "TRITON_ATTN": TRITON_ATTN})
    monkeypatch.setattr(CpuPlatform, "captures_cuda_graphs", True)
    monkeypatch.setattr(cpu_worker, "CPUModelRunner",
                        lambda cfg, device: GPUModelRunner(cfg, device,
                                                           graph_factory=EagerGraph))
    initialize = cpu_worker.CPUWorker.initialize_cache

    def initialize_and_capture(self, num_blocks):
        initialize(self, num_blocks)
        self.model_runner.capture_cudagraphs(progress=False)

    monkeypatch.setattr(cpu_worker.CPUWorker, "initialize_cache", initialize_and_capture)


def _runner_stats(worker):
    runner = worker.model_runner
    graphs = runner.cudagraphs
    return (type(runner.attn_impl).__name__, None if graphs is None else graphs.replays,
            None if graphs is None else sorted(graphs.graphs))


def _prompts(n: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 49000, (lengths[i % len(lengths)],), generator=g).tolist()
            for i in range(n)]


def _hf_reference(path: str, prompts: list[list[int]]) -> list[list[int]]:
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return [hf_greedy(hf, p, NEW_TOKENS)[0] for p in prompts]


def _generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}),
    ("mistral", {"sliding_window": 8}),  # prompts longer than the window
])
def test_greedy_matches_transformers_with_graph_replays(cuda_runner_on_cpu,
                                                        tiny_model_factory, arch, overrides):
    path = tiny_model_factory(arch, **overrides)
    prompts = _prompts(4, [5, 19, 11, 30])
    llm = LLM(model=path, dtype="float32", attention_backend="TRITON_ATTN", max_num_seqs=4,
              max_model_len=64, cudagraph_capture_sizes=[1, 2, 4, 8],
              enable_prefix_caching=False)
    ours = _generate(llm, prompts)
    backend, replays, sizes = llm.collective_rpc(_runner_stats)[0]
    assert backend == "TritonAttentionBackendImpl"
    assert sizes == [1, 2, 4, 8]
    # The prompt step (65 tokens) runs eagerly; the decode steps of 4, 3, 2, 1
    # sequences replay graphs 4, 4, 2 and 1.
    assert replays >= NEW_TOKENS - 1
    assert ours == _hf_reference(path, prompts)


def test_chunked_prefill_and_prefix_hits_through_graphs(cuda_runner_on_cpu,
                                                        tiny_model_factory):
    """A token budget of 8 cuts every prompt into chunks that attend to their cached
    prefix; those steps are small enough for the graphs (mixed batches replayed in
    FULL mode). The second round reuses the first round's prompt blocks."""
    path = tiny_model_factory("llama")
    prompts = _prompts(3, [21, 13, 34], seed=1)
    llm = LLM(model=path, dtype="float32", attention_backend="TRITON_ATTN", max_num_seqs=4,
              max_model_len=64, max_num_batched_tokens=8, block_size=16,
              cudagraph_capture_sizes=[1, 2, 4, 8])
    reference = _hf_reference(path, prompts)
    assert _generate(llm, prompts) == reference
    _, replays_first, _ = llm.collective_rpc(_runner_stats)[0]
    assert replays_first > NEW_TOKENS  # prompt chunks replayed too
    assert _generate(llm, prompts) == reference  # prefix-cache hits this time


def test_enforce_eager_runs_without_graphs(cuda_runner_on_cpu, tiny_model_factory):
    path = tiny_model_factory("llama")
    prompts = _prompts(2, [7, 12], seed=2)
    llm = LLM(model=path, dtype="float32", attention_backend="TRITON_ATTN", max_num_seqs=2,
              max_model_len=64, enforce_eager=True)
    assert _generate(llm, prompts) == _hf_reference(path, prompts)
    backend, replays, _ = llm.collective_rpc(_runner_stats)[0]
    assert backend == "TritonAttentionBackendImpl" and replays is None


def test_moe_model_runs_eagerly_and_matches(cuda_runner_on_cpu, tiny_model_factory):
    """Expert routing reads row counts back to the host, which a graph cannot hold:
    MoE models are not captured (and say so), and stay correct."""
    path = tiny_model_factory("qwen2_moe")
    prompts = _prompts(2, [9, 14], seed=3)
    llm = LLM(model=path, dtype="float32", attention_backend="TRITON_ATTN", max_num_seqs=2,
              max_model_len=64, cudagraph_capture_sizes=[1, 2])
    assert _generate(llm, prompts) == _hf_reference(path, prompts)
    reason = llm.collective_rpc(lambda w: w.model_runner.graphs_unavailable())[0]
    assert "MoE layers" in reason


def test_cuda_layer_kernels_in_the_model_match_transformers(cuda_runner_on_cpu,
                                                            tiny_model_factory, monkeypatch):
    """The CUDA platform's Triton kernels of RMSNorm (in place with the residual),
    SiLU-and-mul and the rotary embedding (in place on the fused qkv views), bound in
    place of the CPU's, inside the model with graph replays: greedy tokens equal
    transformers' (fp32)."""
    from vllm.cuda import ops as cuda_ops
    from vllm.model_executor.custom_op import CustomOp
    from vllm.platforms import current_platform
    current_platform.bind_custom_ops()  # the CPU's first, so they do not overwrite ours
    for name, fn in cuda_ops.CUDA_FORWARDS.items():
        monkeypatch.setitem(CustomOp.entry(name).forwards, "cpu", fn)
    path = tiny_model_factory("llama")
    prompts = _prompts(3, [6, 17, 9], seed=4)
    llm = LLM(model=path, dtype="float32", attention_backend="TRITON_ATTN", max_num_seqs=4,
              max_model_len=64, cudagraph_capture_sizes=[1, 2, 4])
    forwards = llm.collective_rpc(lambda w: sorted({
        m.forward_method_name for m in w.model_runner.model.modules()
        if hasattr(m, "forward_method_name")}))[0]
    assert {"rms_norm_cuda", "silu_and_mul_cuda", "rotary_embedding_cuda"} <= set(forwards)
    assert _generate(llm, prompts) == _hf_reference(path, prompts)
    assert llm.collective_rpc(_runner_stats)[0][1] >= NEW_TOKENS - 1  # graphs replayed


class _CaptureAudit:
    """What a capture reads that it did not make: the storages of tensors that ops in
    the captured function take as inputs without having produced them there. A real
    CUDA graph replays only its recorded kernels, so such a tensor must live as long as
    the graph and hold what the replay needs: a weight, the KV cache, a static input
    buffer. Anything else (a table kept from an eager call before the capture) is read
    from freed or stale memory at replay; EagerGraph alone would not notice, since it
    re-runs the Python code."""

    def __init__(self) -> None:
        self.produced: set[int] = set()
        self.foreign: dict[int, str] = {}

    def run(self, fn):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
        audit = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                for t in tree_flatten((args, kwargs or {}))[0]:
                    if isinstance(t, torch.Tensor) and t.numel():
                        ptr = t.untyped_storage().data_ptr()
                        if ptr not in audit.produced:
                            audit.foreign.setdefault(ptr, f"{func} {tuple(t.shape)}")
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.numel():
                        audit.produced.add(t.untyped_storage().data_ptr())
                return out

        with Mode():
            return fn()


class AuditedEagerGraph(EagerGraph):
    audits: list = []

    def capture(self, fn, pool=None):
        audit = _CaptureAudit()
        AuditedEagerGraph.audits.append(audit)
        return super().capture(lambda: audit.run(fn), pool)


def _allowed_storages(worker) -> set[int]:
    """What a graph may read without producing it: weights and buffers, the KV
    caches, the runner's static input buffers."""
    runner = worker.model_runner
    tensors = list(runner.model.parameters()) + list(runner.model.buffers())
    tensors += [c for c in runner.kv_caches if c.numel()]
    b = runner.cudagraphs.buffers
    tensors += [b.input_ids, b.positions, b.slot_mapping, b.query_start_loc, b.seq_lens,
                b.block_table]
    return {t.untyped_storage().data_ptr() for t in tensors}


@pytest.mark.parametrize("layer_forwards", ["torch", "cuda", "cpu"])
def test_captures_read_only_weights_caches_and_static_buffers(
        cuda_runner_on_cpu, tiny_model_factory, monkeypatch, layer_forwards):
    """Every captured graph reads nothing made before its capture but the weights, the
    KV caches and the static buffers, whichever forwards the layers run: their torch
    ones (the CUDA platform without triton), the CUDA kernels, the CPU's. On an H200,
    captures that reused the rotary tables of the eager warm-up replayed wrong tokens;
    the "torch" case fails on that code."""
    from vllm.cuda import ops as cuda_ops
    from vllm.model_executor.custom_op import CustomOp
    from vllm.platforms import current_platform
    current_platform.bind_custom_ops()
    for name, fn in cuda_ops.CUDA_FORWARDS.items():
        forwards = CustomOp.entry(name).forwards
        if layer_forwards == "cuda":
            monkeypatch.setitem(forwards, "cpu", fn)
        elif layer_forwards == "torch" and "cpu" in forwards:
            monkeypatch.delitem(forwards, "cpu")
    monkeypatch.setattr(AuditedEagerGraph, "audits", [])
    from vllm.cpu import worker as cpu_worker
    monkeypatch.setattr(cpu_worker, "CPUModelRunner",
                        lambda cfg, device: GPUModelRunner(cfg, device,
                                                           graph_factory=AuditedEagerGraph))
    path = tiny_model_factory("llama")
    llm = LLM(model=path, dtype="float32", attention_backend="TRITON_ATTN", max_num_seqs=2,
              max_model_len=64, cudagraph_capture_sizes=[1, 2])
    allowed = llm.collective_rpc(_allowed_storages)[0]
    assert len(AuditedEagerGraph.audits) >= 2
    for audit in AuditedEagerGraph.audits:
        stray = {ptr: op for ptr, op in audit.foreign.items() if ptr not in allowed}
        assert not stray, f"captured ops read tensors made before the capture: {stray}"
    prompts = _prompts(2, [7, 12], seed=5)
    assert _generate(llm, prompts) == _hf_reference(path, prompts)


def test_state_space_model_runs_eagerly_with_the_triton_ssm_kernels(cuda_runner_on_cpu,
                                                                    tmp_path, monkeypatch):
    """A Mamba2 model's mixers keep their requests' states in slots found through
    per-pass metadata, which a replayed graph would not have (its decodes came out
    wrong): the runner does not capture it (and says so). Its conv, SSD scan, gated
    norm and decode steps run the CUDA platform's Triton kernels (bound here in place
    of the CPU's, after them, through the interpreter) and the greedy tokens equal
    transformers'."""
    import transformers

    from tests.models._tiny_families import _save_tokenizer
    from tests.models.test_mamba2 import MAMBA2
    from vllm.cuda.ops import CUDA_KERNELS
    from vllm.model_executor import kernels
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Mamba2Config(**MAMBA2), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)  # decisive greedy choices
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    _save_tokenizer(str(tmp_path))
    calls: set[str] = set()

    def counted(name, fn):
        def call(*args, **kwargs):
            calls.add(name)
            return fn(*args, **kwargs)
        return call
    from vllm.platforms import current_platform
    current_platform.bind_custom_ops()  # the CPU's first, so they do not overwrite ours
    table = kernels._bound.setdefault("cpu", {})
    for name, fn in CUDA_KERNELS.items():
        monkeypatch.setitem(table, name, counted(name, fn))
    prompts = _prompts(3, [3, 12, 7], seed=5)
    llm = LLM(model=str(tmp_path), dtype="float32", attention_backend="TRITON_ATTN",
              max_num_seqs=4, max_model_len=64, cudagraph_capture_sizes=[1, 2, 4])
    assert _generate(llm, prompts) == _hf_reference(str(tmp_path), prompts)
    reason = llm.collective_rpc(lambda w: w.model_runner.graphs_unavailable())[0]
    assert "state-space layers" in reason
    assert llm.collective_rpc(_runner_stats)[0][1] is None  # no graphs
    assert calls == {"causal_conv1d", "causal_conv1d_step", "ssd_step", "ssd_chunk_scan",
                     "gated_rms_norm"}
