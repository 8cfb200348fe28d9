"""Model sources (Hub ids through a Hugging Face cache layout, --download-dir, --revision,
HF_HUB_OFFLINE), custom-code configs refused, hf_overrides, tokenizer_mode."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from vllm.transformers_utils.config import create_model_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_hub_cache(cache: str, repo_id: str, snapshots: dict[str, str],
                   refs: dict[str, str]) -> None:
    """The layout huggingface_hub keeps: models--org--name/{refs/<ref>, snapshots/<sha>}."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    for sha, src in snapshots.items():
        shutil.copytree(src, os.path.join(repo, "snapshots", sha))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    for ref, sha in refs.items():
        with open(os.path.join(repo, "refs", ref), "w") as f:
            f.write(sha)


SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.transformers_utils.config import create_model_config
cache, local = sys.argv[1], sys.argv[2]
out = {}
out["default_cache"] = create_model_config(model="acme/tiny").model_path
out["v2"] = create_model_config(model="acme/tiny", revision="v2", download_dir=cache).model_path
try:
    create_model_config(model="acme/missing")
except ValueError as e:
    out["missing"] = str(e)
greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
tokens = []
for model in ("acme/tiny", local):
    llm = LLM(model=model, download_dir=cache, dtype="float32", max_model_len=128,
              kv_cache_memory_bytes=8 << 20)
    tokens.append(llm.generate(["The capital of France is"], greedy,
                               use_tqdm=False)[0].outputs[0].token_ids)
    out.setdefault("served_name", llm.llm_engine.vllm_config.model_config.served_model_name)
    llm.llm_engine.shutdown()
out["tokens"] = tokens
print("RESULT" + json.dumps(out))
"""


def test_hub_id_resolves_from_the_cache_offline(tiny_model_factory, tmp_path):
    main_dir = tiny_model_factory("qwen2")
    v2_dir = tiny_model_factory("llama")
    cache = str(tmp_path / "hf-cache")
    sha1, sha2 = "a" * 40, "b" * 40
    make_hub_cache(cache, "acme/tiny", {sha1: main_dir, sha2: v2_dir},
                   {"main": sha1, "v2": sha2})
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=cache,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, cache, main_dir], env=env,
                          capture_output=True, text=True, timeout=300)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    out = json.loads(line[0][len("RESULT"):])
    assert out["default_cache"].endswith(os.path.join("snapshots", sha1))
    assert out["v2"].endswith(os.path.join("snapshots", sha2))
    assert "acme/missing" in out["missing"] and "Hugging Face" in out["missing"]
    assert out["tokens"][0] == out["tokens"][1]  # the snapshot is the local model
    assert out["served_name"] == ["acme/tiny"]


def _with_config(src: str, dst, **changes) -> str:
    shutil.copytree(src, dst)
    cfg_file = dst / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(changes)
    cfg_file.write_text(json.dumps(cfg))
    return str(dst)


def test_custom_code_configs(tiny_model_factory, tmp_path):
    src = tiny_model_factory("llama")
    custom = _with_config(src, tmp_path / "custom", model_type="acme_lm",
                          architectures=["AcmeForCausalLM"],
                          auto_map={"AutoConfig": "configuration_acme.AcmeConfig",
                                    "AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"})
    for trust in (False, True):
        with pytest.raises(ValueError, match="custom code .*AcmeForCausalLM.*never executed"):
            create_model_config(model=custom, trust_remote_code=trust)
    # Custom code shipped for an architecture both transformers and we implement: ignored.
    known = _with_config(src, tmp_path / "known", auto_map={
        "AutoModelForCausalLM": "modeling_llama_custom.LlamaForCausalLM"})
    assert create_model_config(model=known, trust_remote_code=True).architectures == [
        "LlamaForCausalLM"]


def test_hf_overrides(tiny_model_factory):
    path = tiny_model_factory("mistral")
    cfg = create_model_config(model=path, hf_overrides={"sliding_window": 4,
                                                        "max_position_embeddings": 64})
    assert cfg.hf_config.sliding_window == 4 and cfg.max_model_len == 64
    with pytest.raises(ValueError, match="hf_overrides"):
        create_model_config(model=path, hf_overrides=["sliding_window"])


def test_tokenizer_mode(tiny_model_factory):
    path = tiny_model_factory("llama")
    assert create_model_config(model=path, tokenizer_mode="slow").tokenizer_mode == "slow"
    with pytest.raises(ValueError, match="tokenizer_mode"):
        create_model_config(model=path, tokenizer_mode="custom")
