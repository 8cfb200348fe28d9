"""`--quantization inc`: INC's MEASURE / QUANTIZE flow, on the fake HPU and on CPU.

References we did not produce with the engine:
- statistics: forward hooks on transformers' model over the same prompts record
  the max-abs of each linear layer's input, output and weight (the fused qkv /
  gate_up layers see the max over their parts);
- numerics: transformers' model with every decoder linear layer replaced by the
  quantize-dequantize (QDQ) of INC's documented recipe (scale = max-abs over
  backoff * 448, rounded up to a power of two for maxabs_hw; input backoff 0.25,
  weight 0.5), written here from the formula. Both sides compute in float32, where
  fp8 values and their products are exact and power-of-two scales divide exactly,
  so they differ only by summation order and by an activation whose scaled value
  sits on a rounding boundary (one fp8 step, 1/16 relative, of one element): the
  logits agree to 2e-3 of their range (as tests/quantization/test_fp8.py) and the
  greedy tokens are identical.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.engine.conftest import PROMPTS
from tests.hpu.conftest import SMALL_BUCKETS, make_llm, platform_env, release, runner_of
from tests.quantization._ckpt import float_dir

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
MAX_TOKENS = 8


def _write_config(tmp, name: str, **fields) -> str:
    path = os.path.join(str(tmp), f"{name}.json")
    with open(path, "w") as f:
        json.dump(fields, f)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The tiny random llama, with token 0 (what bucket padding and warmup rows hold)
    embedded as a spike: after RMSNorm it reaches sqrt(hidden) = 8 in one channel,
    far above any real token's inputs, so statistics polluted by padding would show."""
    import transformers
    path = float_dir(str(tmp_path_factory.mktemp("inc")))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[0].zero_()
        emb[0, 0] = 1.0
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tok(tiny):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def hf_model(tiny):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


def _engine_node(hf_name: str) -> str:
    head, _, last = hf_name.rpartition(".")
    for fused, parts in FUSED.items():
        if last in parts:
            return f"{head}.{fused}"
    return hf_name


@torch.no_grad()
def hf_stats(model, prompt_ids: list[list[int]]) -> dict[str, dict[str, float]]:
    """Max-abs per engine node, from forward hooks on transformers' decoder linears."""
    stats: dict[str, dict[str, float]] = {}

    def hook(name):
        def record(module, args, out):
            node = stats.setdefault(_engine_node(name), {"input": 0.0, "output": 0.0,
                                                         "weight": 0.0})
            node["input"] = max(node["input"], args[0].abs().max().item())
            node["output"] = max(node["output"], out.abs().max().item())
            node["weight"] = max(node["weight"], module.weight.abs().max().item())
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in n]
    try:
        for ids in prompt_ids:
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return stats


def _pow2_scale(maxabs: float, backoff: float) -> float:
    return 2.0 ** math.ceil(math.log2(maxabs / (backoff * 448.0)))


class QDQLinear(torch.nn.Module):
    """INC's static fp8 recipe on one transformers linear, simulated in float32."""

    def __init__(self, linear: torch.nn.Linear, s_in: float, s_w: float) -> None:
        super().__init__()
        self.s_in, self.s_w = s_in, s_w
        self.w = (linear.weight / s_w).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s_w
        self.bias = linear.bias

    def forward(self, x):
        xq = (x / self.s_in).clamp(-448, 448).to(torch.float8_e4m3fn).float() * self.s_in
        return F.linear(xq, self.w, self.bias)


def qdq_reference(tiny: str, stats_json: str):
    """transformers' model with maxabs_hw QDQ linears, scales from the stats file."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with open(stats_json) as f:
        nodes = json.load(f)["Nodes"]
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in n}
    fused_w: dict[str, float] = {}
    for name, lin in linears.items():
        node = _engine_node(name)
        fused_w[node] = max(fused_w.get(node, 0.0), lin.weight.abs().max().item())
    for name, lin in linears.items():
        node = _engine_node(name)
        qdq = QDQLinear(lin, _pow2_scale(nodes[node]["inputs"][0][0], 0.25),
                        _pow2_scale(fused_w[node], 0.5))
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, qdq)
    return model.eval()


def _greedy_ref(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             min_new_tokens=MAX_TOKENS, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _generate(llm, prompt_ids, max_tokens=MAX_TOKENS):
    from vllm import SamplingParams
    outs = llm.generate([{"prompt_token_ids": i} for i in prompt_ids],
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _inc_llm(tiny, **kw):
    return make_llm(model=tiny, quantization="inc", max_model_len=256, **kw)


@pytest.fixture(scope="module")
def measured(tiny, tok, tmp_path_factory):
    """One MEASURE run on the fake HPU (outputs measured too): (dump prefix, prompts)."""
    tmp = tmp_path_factory.mktemp("measure")
    dump = os.path.join(str(tmp), "out", "measure")
    cfg = _write_config(tmp, "measure", mode="MEASURE", observer="maxabs",
                        measure_exclude="NONE", dump_stats_path=dump)
    prompts = [tok.encode(p) for p in PROMPTS]
    with platform_env("hpu", QUANT_CONFIG=cfg, **SMALL_BUCKETS):
        llm = _inc_llm(tiny)
        assert runner_of(llm).calibrating
        _generate(llm, prompts, max_tokens=1)  # prompts only: one prefill each
        written_before_shutdown = os.path.exists(dump + "_hooks_maxabs.json")
        llm.llm_engine.model_executor.shutdown()  # vLLM-Gaudi's end of calibration
        release(llm)
    assert not written_before_shutdown
    return dump, prompts


def test_measure_writes_inc_layout_with_hook_values(measured, hf_model):
    dump, prompts = measured
    with open(dump + "_hooks_maxabs.json") as f:
        doc = json.load(f)
    assert doc["Mode"] == "DynamicRange" and set(doc) >= {"GlobalRank", "LocalRank", "Nodes"}
    assert all(0 not in ids for ids in prompts)
    ref = hf_stats(hf_model, prompts)
    padded = hf_stats(hf_model, prompts + [[0]])
    assert padded["model.layers.0.self_attn.qkv_proj"]["input"] > 2 * ref[
        "model.layers.0.self_attn.qkv_proj"]["input"]  # padding rows would show
    nodes = doc["Nodes"]
    assert set(nodes) == set(ref) and len(nodes) == 2 * 4
    npz = np.load(dump + "_hooks_maxabs.npz")
    for name, node in nodes.items():
        assert set(node) == {"inputs", "outputs", "params"}
        for ours, key in ((node["inputs"][0][0], "input"), (node["outputs"][0][0], "output"),
                          (node["params"]["weight"][0][0], "weight")):
            assert ours == pytest.approx(ref[name][key], rel=1e-5), (name, key)
        assert float(npz[f"{name}/inputs/0"][0]) == pytest.approx(node["inputs"][0][0])
        assert float(npz[f"{name}/params/weight"][0][0]) == pytest.approx(
            node["params"]["weight"][0][0])


def _quant_config(tmp, dump: str, **extra) -> str:
    return _write_config(tmp, "quant", mode="QUANTIZE", observer="maxabs",
                         scale_method="maxabs_hw", dump_stats_path=dump, **extra)


@pytest.mark.parametrize("target", ["hpu", "cpu"])
def test_quantize_matches_qdq_reference(measured, tiny, tmp_path, target):
    from tests.models._model_helpers import full_prompt_logits, make_vllm_config
    from vllm.model_executor.model_loader import get_model
    dump, prompts = measured
    reference = qdq_reference(tiny, dump + "_hooks_maxabs.json")
    cfg = _quant_config(tmp_path, dump)
    with platform_env(target, QUANT_CONFIG=cfg, **SMALL_BUCKETS):
        vcfg = make_vllm_config(tiny)
        from vllm.transformers_utils.config import create_model_config
        vcfg.model_config = create_model_config(model=tiny, dtype="float32", quantization="inc")
        model = get_model(vcfg)
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert qkv.weight.dtype == torch.float8_e4m3fn
        ids = torch.tensor(prompts[1] + prompts[3])
        ours = full_prompt_logits(model, ids)
        with torch.no_grad():
            ref = reference(ids[None]).logits[0]
        span = float(ref.max() - ref.min())
        assert (ours - ref).abs().max().item() < 2e-3 * span
        del model
        llm = _inc_llm(tiny)
        got = _generate(llm, prompts)
        release(llm)
    for ids_, out in zip(prompts, got):
        assert out == _greedy_ref(reference, ids_)


def test_cpu_measure_writes_the_same_statistics(measured, tiny, tmp_path):
    """The MEASURE run on CPU (no bucket padding there) records what the fake HPU did."""
    dump, prompts = measured
    cpu_dump = str(tmp_path / "cpu" / "measure")
    cfg = _write_config(tmp_path, "measure", mode="MEASURE", measure_exclude="NONE",
                        dump_stats_path=cpu_dump)
    with platform_env("cpu", QUANT_CONFIG=cfg):
        llm = _inc_llm(tiny)
        _generate(llm, prompts, max_tokens=1)
        paths = llm.llm_engine.finalize_calibration()  # INC's explicit trigger
        release(llm)
    assert paths == [cpu_dump + "_hooks_maxabs.json"]
    with open(paths[0]) as f:
        cpu_nodes = json.load(f)["Nodes"]
    with open(dump + "_hooks_maxabs.json") as f:
        hpu_nodes = json.load(f)["Nodes"]
    assert set(cpu_nodes) == set(hpu_nodes)
    for name, node in cpu_nodes.items():
        for kind in ("inputs", "outputs"):
            assert node[kind][0][0] == pytest.approx(hpu_nodes[name][kind][0][0], rel=1e-5)


def _scaled_stats(src: str, dst_prefix: str, factor: float) -> str:
    with open(src + "_hooks_maxabs.json") as f:
        doc = json.load(f)
    for node in doc["Nodes"].values():
        node["inputs"] = [[node["inputs"][0][0] * factor]]
    os.makedirs(os.path.dirname(dst_prefix), exist_ok=True)
    with open(dst_prefix + "_hooks_maxabs.json", "w") as f:
        json.dump(doc, f)
    return dst_prefix


@pytest.mark.parametrize("rsp,lazy", [("1", "1"), ("1", "0"), ("0", "1")])
def test_scale_change_compiles_only_without_runtime_patching(measured, tiny, tmp_path, rsp,
                                                            lazy):
    """RUNTIME_SCALE_PATCHING=1: new scales after warmup compile nothing (HPU graphs and
    torch.compile); =0: the scales are graph constants, so every bucket in use
    recompiles."""
    from tests.models._model_helpers import full_prompt_logits
    dump, prompts = measured
    other = _scaled_stats(dump, os.path.join(str(tmp_path), "b", "measure"), 1 / 16)
    cfg = _quant_config(tmp_path, dump)
    with platform_env("hpu", QUANT_CONFIG=cfg, RUNTIME_SCALE_PATCHING=rsp,
                      PT_HPU_LAZY_MODE=lazy, **SMALL_BUCKETS):
        llm = _inc_llm(tiny)
        runner = runner_of(llm)
        layer = runner.model.model.layers[0].self_attn.qkv_proj
        before = float(layer.inc_input_scale)
        first = _generate(llm, prompts[:2], max_tokens=3)
        assert llm.llm_engine.get_compile_stats()["num_compiles_after_warmup"] == 0
        assert llm.llm_engine.reload_quant_scales(other) == 8
        assert float(layer.inc_input_scale) == before / 16  # inputs now clip at 4x range
        second = _generate(llm, prompts[:2], max_tokens=3)
        compiles = llm.llm_engine.get_compile_stats()["num_compiles_after_warmup"]
        ids = torch.tensor(prompts[1] + prompts[3])
        ours = full_prompt_logits(runner.model, ids)  # the served model, new scales
        release(llm)
    with torch.no_grad():
        new_ref = qdq_reference(tiny, other + "_hooks_maxabs.json")(ids[None]).logits[0]
        old_ref = qdq_reference(tiny, dump + "_hooks_maxabs.json")(ids[None]).logits[0]
    span = float(new_ref.max() - new_ref.min())
    assert (ours - new_ref).abs().max().item() < 2e-3 * span
    assert (ours - old_ref).abs().max().item() > 2e-2 * span  # the scales did change
    assert len(first) == len(second) == 2
    if rsp == "1":
        assert compiles == 0
    else:
        assert compiles > 0


def test_trivial_scales_mode_drops_unit_scales(measured, tiny, tmp_path, monkeypatch):
    """PT_HPU_H2D_TRIVIAL_SCALES_MODE: 1 drops input scales of 1.0 from the cast, 2 from
    the GEMM too; results are unchanged, and a scale leaving 1.0 changes the graph key
    (a new graph, as Gaudi documents), which it does not in mode 0."""
    from tests.models._model_helpers import full_prompt_logits, make_vllm_config
    from vllm.hpu.graph_keys import baked_constants
    from vllm.hpu.habana import fp8_ops
    from vllm.transformers_utils.config import create_model_config
    from vllm.model_executor.model_loader import get_model
    dump, _ = measured
    with open(dump + "_hooks_maxabs.json") as f:
        doc = json.load(f)
    for node in doc["Nodes"].values():
        node["inputs"] = [[0.25 * 448.0]]  # maxabs_hw input scale exactly 1.0
    unit = str(tmp_path / "u" / "measure")
    os.makedirs(os.path.dirname(unit))
    with open(unit + "_hooks_maxabs.json", "w") as f:
        json.dump(doc, f)
    cfg = _quant_config(tmp_path, unit)
    seen = {"cast": [], "gemm": []}
    cast, gemm = fp8_ops.cast_to_fp8_v2, fp8_ops.fp8_gemm_v2
    monkeypatch.setattr(fp8_ops, "cast_to_fp8_v2",
                        lambda x, s, *a: seen["cast"].append(s) or cast(x, s, *a))
    monkeypatch.setattr(fp8_ops, "fp8_gemm_v2",
                        lambda *a: seen["gemm"].append(a[6:8]) or gemm(*a))
    ids = torch.arange(5, 25)
    results = {}
    for mode in ("0", "1", "2"):
        seen["cast"].clear(), seen["gemm"].clear()
        with platform_env("hpu", QUANT_CONFIG=cfg, RUNTIME_SCALE_PATCHING="1",
                          PT_HPU_H2D_TRIVIAL_SCALES_MODE=mode):
            vcfg = make_vllm_config(str(tiny))
            vcfg.model_config = create_model_config(model=tiny, dtype="float32", quantization="inc")
            model = get_model(vcfg)
            results[mode] = full_prompt_logits(model, ids)
            key_unit = baked_constants(model)
            layer = model.model.layers[0].mlp.down_proj
            layer.quant_method.set_input_scale(layer, 448.0)  # s_in = 4: not trivial
            key_changed = baked_constants(model)
        assert len(seen["cast"]) == len(seen["gemm"]) == 8
        assert all((s is None) == (mode != "0") for s in seen["cast"])
        assert all((a is None) == (mode == "2") and b is not None for a, b in seen["gemm"])
        assert (key_unit != key_changed) == (mode != "0")
    assert torch.equal(results["0"], results["1"]) and torch.equal(results["0"], results["2"])


def _build(tmp_path, target="hpu", **env):
    from vllm.model_executor.layers.quantization import build_quant_config
    from transformers import LlamaConfig
    with platform_env(target, **env):
        return build_quant_config("inc", LlamaConfig())


@pytest.mark.parametrize("fields,env,message", [
    ({"mode": "CALIBRATE"}, {}, "mode='CALIBRATE'"),
    ({"mode": "QUANTIZE", "scale_method": "maxabs_hw_opt_weight"}, {}, "scale_method="),
    ({"mode": "QUANTIZE", "scale_method": "maxabs_hw", "dump_stats_path": "nowhere/x"}, {},
     "dump_stats_path='nowhere/x'"),
    ({"mode": "MEASURE", "observer": "save"}, {}, "observer='save'"),
    ({"mode": "MEASURE", "quantize_lm_head": True}, {}, "quantize_lm_head"),
    ({"mode": "MEASURE", "allowlist": {"names": "q_proj"}}, {}, "allowlist.names"),
    ({"mode": "MEASURE", "scale_params": {"input_backoff": 2}}, {}, "input_backoff"),
    ({"mode": "QUANTIZE"}, {"PT_HPU_H2D_TRIVIAL_SCALES_MODE": "3"},
     "PT_HPU_H2D_TRIVIAL_SCALES_MODE=3"),
    ({"mode": "QUANTIZE"}, {"PT_HPU_H2D_TRIVIAL_SCALES_MODE": "1",
                            "RUNTIME_SCALE_PATCHING": "0"}, "RUNTIME_SCALE_PATCHING=1"),
])
def test_bad_config_names_the_field(tmp_path, monkeypatch, fields, env, message):
    monkeypatch.chdir(tmp_path)
    cfg = _write_config(tmp_path, "bad", **fields)
    with pytest.raises(ValueError, match=message) as err:
        _build(tmp_path, QUANT_CONFIG=cfg, **env)
    assert "QUANT_CONFIG" in str(err.value) or "PT_HPU" in message or "RUNTIME" in message


def test_missing_config_and_missing_layer(tiny, tmp_path, measured):
    with pytest.raises(ValueError, match="QUANT_CONFIG is not set"):
        _build(tmp_path, QUANT_CONFIG="")
    with pytest.raises(ValueError, match="no such file"):
        _build(tmp_path, QUANT_CONFIG=str(tmp_path / "absent.json"))
    # A measurement that lacks a layer: the engine does not start (names layer and file).
    dump, _ = measured
    with open(dump + "_hooks_maxabs.json") as f:
        doc = json.load(f)
    doc["Nodes"].pop("model.layers.1.mlp.down_proj")
    partial = str(tmp_path / "p" / "measure")
    os.makedirs(os.path.dirname(partial))
    with open(partial + "_hooks_maxabs.json", "w") as f:
        json.dump(doc, f)
    cfg = _quant_config(tmp_path, partial)
    with platform_env("hpu", QUANT_CONFIG=cfg, **SMALL_BUCKETS):
        with pytest.raises(ValueError, match="model.layers.1.mlp.down_proj"):
            _inc_llm(tiny)
