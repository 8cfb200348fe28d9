"""Every GPU check of the CUDA backend in one run (a lent GPU's time is short).

    python benchmarks/cuda_acceptance.py --out cuda_results.json

1. Triton kernels on the GPU: the kernel tests (tests/kernels: attention, and the
   layers' RMSNorm / SiLU-and-mul / rotary) with CUDA tensors.
2. Correctness: greedy tokens of tiny fp32 random-weight models (Llama, a Mistral
   with a sliding window, a Qwen2-MoE), CUDA graphs on, vs transformers on the GPU.
3. Serving: the OpenAI server on the tiny Llama, the official client, completions and
   streamed chat; the completion's tokens equal the offline ones.
4. Numbers on a ~1B Llama-shaped bf16 model (random weights): batch-1 decode tokens/s
   against the HBM roofline (also with `async_scheduling=True`), 64 x 128/128
   throughput against transformers `generate`, and `--quantization fp8` against bf16
   at batch 64.

Each part prints one JSON line and the file gathers them; a failing part is recorded
and the rest still run. `--device cpu --small` runs the same code on tiny shapes on a
CPU (the script's own check: it needs no GPU, the numbers mean nothing there).
"""
from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import gc
import json
import subprocess
import tempfile
import time
import traceback
from typing import Any, Callable

import torch

VOCAB = 4096
"""Tiny models' vocabulary: a word-level tokenizer of this many words is saved with
them, so nothing is downloaded."""

BIG = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
           num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
           max_position_embeddings=4096, tie_word_embeddings=False)
"""The ~1B Llama shape of the issue's measurements (1.1 B parameters)."""

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12, "B200": 8.0e12, "A100": 2.0e12}
"""Nominal HBM bandwidth by GPU name (the roofline's denominator); H100 (SXM) otherwise."""


def hbm_bytes_per_s(device_name: str) -> float:
    for key, value in HBM_BYTES_PER_S.items():
        if key in device_name:
            return value
    return HBM_BYTES_PER_S["H100"]


def measured_copy_bytes_per_s(device: str) -> float:
    """Device-to-device copy bandwidth, bytes read plus written (what a GPU really moves)."""
    if device != "cuda":
        return 0.0
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / seconds


def save_tokenizer(directory: str) -> None:
    """A word-level tokenizer ("w0".."wN" split on spaces), enough for the server."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}w3{% endif %}")
    fast.save_pretrained(directory)


def tiny_model(directory: str, arch: str) -> str:
    import transformers
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "mistral_sliding": lambda: transformers.MistralConfig(**common, sliding_window=16),
        "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=64),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[arch](),
                                                          dtype=torch.float32)
    with torch.no_grad():  # decisive greedy choices from random weights
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    path = os.path.join(directory, arch)
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path)
    return path


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _free(*objs: Any) -> None:
    for o in objs:
        shutdown = getattr(getattr(o, "llm_engine", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ parts
def part_kernels(args: argparse.Namespace) -> dict:
    env = dict(os.environ, VLLM_TEST_TRITON_DEVICE=args.device)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/kernels/test_triton_attention.py",
                           "tests/kernels/test_triton_layer_kernels.py"], env=env,
                          capture_output=True, text=True, timeout=300)
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    return {"ok": proc.returncode == 0, "pytest": tail[0]}


def part_correctness(args: argparse.Namespace, tmp: str) -> dict:
    results = {}
    for arch, eager in (("llama", False), ("llama", True), ("mistral_sliding", False),
                        ("mistral_sliding", True), ("qwen2_moe", False)):
        key = arch + ("_eager" if eager else "")
        try:
            results[key] = _greedy_vs_transformers(args, tmp, arch, enforce_eager=eager)
        except Exception as e:  # one architecture's failure must not hide the others
            results[key] = f"{type(e).__name__}: {e}"[:500] + traceback.format_exc()[-1500:]
    results["ok"] = all(v.startswith("8/8") for k, v in results.items())
    return results


def _greedy_vs_transformers(args: argparse.Namespace, tmp: str, arch: str,
                            **llm_kwargs: Any) -> str:
    import transformers

    from vllm import LLM, SamplingParams
    path = os.path.join(tmp, arch)
    if not os.path.isdir(path):
        tiny_model(tmp, arch)
    ps = prompts(8, 24, VOCAB, seed=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32).to(args.device)
    ref = []
    for p in ps:
        out = hf.generate(torch.tensor([p], device=args.device), max_new_tokens=32,
                          do_sample=False, min_new_tokens=32, eos_token_id=None,
                          pad_token_id=0)
        ref.append(out[0, len(p):].tolist())
    _free(hf)
    llm = LLM(model=path, dtype="float32", device=args.device, max_model_len=256,
              max_num_seqs=8, gpu_memory_utilization=0.3, **llm_kwargs)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps],
                        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    ours = [list(o.outputs[0].token_ids) for o in outs]
    _free(llm)
    first_diff = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), None)
                  for o, r in zip(ours, ref)]
    return (f"{sum(a == b for a, b in zip(ours, ref))}/{len(ps)} identical; first "
            f"differing token per prompt {first_diff}")


def part_serving(args: argparse.Namespace, tmp: str) -> dict:
    import openai

    from vllm import LLM, SamplingParams
    path = os.path.join(tmp, "llama") if os.path.isdir(os.path.join(tmp, "llama")) \
        else tiny_model(tmp, "llama")
    text = " ".join(f"w{i}" for i in range(10, 40))
    llm = LLM(model=path, dtype="float32", device=args.device, max_model_len=256,
              gpu_memory_utilization=0.3)
    offline = llm.generate([text], SamplingParams(temperature=0, max_tokens=16,
                                                  ignore_eos=True))[0].outputs[0].text
    _free(llm)
    port = 8765
    log_path = os.path.join(tmp, "server.log")
    log = open(log_path, "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", path,
         "--dtype", "float32", "--device", args.device, "--max-model-len", "256",
         "--gpu-memory-utilization", "0.3", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        deadline = time.time() + 150
        while True:
            try:
                model = client.models.list().data[0].id
                break
            except Exception:
                if time.time() > deadline or server.poll() is not None:
                    with open(log_path) as f:
                        raise RuntimeError("server did not start: " + f.read()[-3000:])
                time.sleep(1)
        comp = client.completions.create(model=model, prompt=text, max_tokens=16,
                                         temperature=0, extra_body={"ignore_eos": True})
        chunks = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=16,
            temperature=0, stream=True)
        streamed = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
        return {"ok": comp.choices[0].text == offline and len(streamed) > 0,
                "completion_equals_offline": comp.choices[0].text == offline,
                "stream_chars": len(streamed)}
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _big_dir(tmp: str, small: bool) -> str:
    import transformers
    path = os.path.join(tmp, "big")
    shape = dict(BIG)
    if small:
        shape.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
    transformers.LlamaConfig(**shape, bos_token_id=1, eos_token_id=2,
                             architectures=["LlamaForCausalLM"]).save_pretrained(path)
    save_tokenizer(path)
    return path


def _our_throughput(path: str, device: str, n: int, in_len: int, out_len: int,
                    **kwargs: Any) -> tuple[float, Any]:
    from vllm import LLM, SamplingParams
    # A fixed KV cache: an engine's memory is not all returned to the process when it
    # shuts down, so sizing by gpu_memory_utilization would starve the next engine.
    kwargs.setdefault("kv_cache_memory_bytes", 4 << 30)
    llm = LLM(model=path, dtype="bfloat16", device=device, load_format="dummy",
              max_model_len=1024, **kwargs)
    sp = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    warm = [{"prompt_token_ids": p} for p in prompts(min(n, 8), in_len, 1000, 0)]
    llm.generate(warm, sp, use_tqdm=False)
    batch = [{"prompt_token_ids": p} for p in prompts(n, in_len, 1000, 1)]
    start = time.perf_counter()
    outs = llm.generate(batch, sp, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens / seconds, llm


def _model_bytes(worker: Any) -> int:
    return sum(p.numel() * p.element_size() for p in worker.model_runner.model.parameters())


def _weight_bytes(llm: Any) -> int:
    """Bytes of weights a decode step reads (the roofline's numerator)."""
    return llm.collective_rpc(_model_bytes)[0]


def _trace_summary(directory: str, tokens: int, seconds: float) -> dict:
    """Kernels, GPU busy time and the top kernels / host ops of the newest trace."""
    import glob
    import gzip
    deadline = time.time() + 30
    while not glob.glob(os.path.join(directory, "*.json*")) and time.time() < deadline:
        time.sleep(0.5)
    path = max(glob.glob(os.path.join(directory, "*.json*")), key=os.path.getmtime)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels: dict[str, float] = {}
    ops: dict[str, float] = {}
    count = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "kernel":
            kernels[e["name"][:80]] = kernels.get(e["name"][:80], 0.0) + e["dur"]
            count += 1
        elif e.get("cat") in ("cpu_op", "user_annotation") or (
                e.get("cat") == "python_function" and "vllm/" in e["name"]):
            ops[e["name"][:80]] = ops.get(e["name"][:80], 0.0) + e["dur"]
    busy_ms = sum(kernels.values()) / 1e3
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1])[:25]
    return {"tokens": tokens, "wall_ms_per_token": round(seconds * 1e3 / tokens, 3),
            "gpu_busy_ms_per_token": round(busy_ms / tokens, 3),
            "kernels_per_token": round(count / tokens, 1),
            "top_kernels_ms": {k: round(v / 1e3, 2) for k, v in top},
            "top_host_ops_ms": {k: round(v / 1e3, 2) for k, v in top_ops}}


def _profile_batch1(llm: Any, in_len: int, tokens: int) -> dict:
    """Batch-1 decode under the torch profiler (VLLM_TORCH_PROFILER_DIR set by main)."""
    from vllm import SamplingParams
    directory = os.environ["VLLM_TORCH_PROFILER_DIR"]
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    batch = [{"prompt_token_ids": prompts(1, in_len, 1000, 5)[0]}]
    llm.start_profile()
    start = time.perf_counter()
    llm.generate(batch, sp, use_tqdm=False)
    seconds = time.perf_counter() - start
    llm.stop_profile()
    return _trace_summary(directory, tokens, seconds)


def _so_far(res: dict) -> None:
    """The numbers measured so far (a run cut off by its time limit keeps them)."""
    shown = {k: v for k, v in res.items() if k != "batch1_profile"}
    print(json.dumps({"numbers_so_far": shown}), flush=True)


def part_numbers(args: argparse.Namespace, tmp: str) -> dict:
    import transformers
    path = _big_dir(tmp, args.small)
    n, in_len, out_len = (8, 16, 16) if args.small else (64, 128, 128)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    res: dict[str, Any] = {"device": name}
    copy = measured_copy_bytes_per_s(args.device)
    b1, llm = _our_throughput(path, args.device, 1, in_len, out_len)
    wbytes = _weight_bytes(llm)
    try:
        res["batch1_profile"] = _profile_batch1(llm, in_len, 32)
    except Exception as e:  # the numbers matter more than the trace
        res["batch1_profile"] = f"{type(e).__name__}: {e}"
    _free(llm)
    roofline = hbm_bytes_per_s(name) / wbytes
    res.update(batch1_tok_s=round(b1, 1), weights_gb=round(wbytes / 1e9, 3),
               hbm_tb_s_nominal=hbm_bytes_per_s(name) / 1e12,
               copy_tb_s_measured=round(copy / 1e12, 2),
               roofline_tok_s=round(roofline, 1), roofline_share=round(b1 / roofline, 3))
    _so_far(res)
    b1_async, llm = _our_throughput(path, args.device, 1, in_len, out_len,
                                    async_scheduling=True)
    _free(llm)
    res.update(batch1_async_tok_s=round(b1_async, 1),
               roofline_share_async=round(b1_async / roofline, 3))
    bf16, llm = _our_throughput(path, args.device, n, in_len, out_len)
    _free(llm)
    res.update(batch64_tok_s=round(bf16, 1))
    _so_far(res)
    cfg = transformers.AutoConfig.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(
        args.device)
    ids = torch.tensor(prompts(n, in_len, 1000, 1), device=args.device)
    hf.generate(ids[:2], max_new_tokens=4, do_sample=False, pad_token_id=0)
    start = time.perf_counter()
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len,
                      min_new_tokens=out_len, do_sample=False, pad_token_id=0)
    hf_tok_s = (out.shape[1] - in_len) * n / (time.perf_counter() - start)
    _free(hf)
    res.update(hf_generate_tok_s=round(hf_tok_s, 1), ours_over_hf=round(bf16 / hf_tok_s, 2))
    _so_far(res)
    fp8, llm = _our_throughput(path, args.device, n, in_len, out_len, quantization="fp8")
    _free(llm)
    res.update(fp8_tok_s=round(fp8, 1), fp8_over_bf16=round(fp8 / bf16, 3))
    _so_far(res)
    eager, llm = _our_throughput(path, args.device, n, in_len, out_len, enforce_eager=True)
    _free(llm)
    res.update(eager_batch64_tok_s=round(eager, 1))
    res["goals"] = {"roofline_share>=0.7": res["roofline_share"] >= 0.7,
                    "ours_over_hf>=8": res["ours_over_hf"] >= 8,
                    "fp8_over_bf16>=1.3": res["fp8_over_bf16"] >= 1.3}
    res["ok"] = True
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a dry run)")
    parser.add_argument("--parts", default="correctness,numbers,serving,kernels")
    parser.add_argument("--out", default="cuda_results.json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("VLLM_TORCH_PROFILER_DIR", os.path.join(tmp, "traces"))
        runs: dict[str, Callable[[], dict]] = {
            "kernels": lambda: part_kernels(args),
            "correctness": lambda: part_correctness(args, tmp),
            "serving": lambda: part_serving(args, tmp),
            "numbers": lambda: part_numbers(args, tmp),
        }
        for name in args.parts.split(","):
            start = time.perf_counter()
            try:
                results[name] = runs[name]()
            except Exception as e:  # record and go on: the GPU time is spent either way
                results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                 "trace": traceback.format_exc()[-3000:]}
            results[name]["seconds"] = round(time.perf_counter() - start, 1)
            print(json.dumps({name: results[name]}), flush=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
