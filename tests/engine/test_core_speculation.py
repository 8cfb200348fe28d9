"""The early engine core's head start (vllm/engine/core_speculation.py): the config is
built before the fork only from local, ready files, equals the one the server builds
next, is dropped silently when it cannot be built, and an engine initialized from it is
kept only when the server's config and environment are equal, else shut down."""
from __future__ import annotations

import logging
import os

import pytest

from vllm.engine import core_speculation
from vllm.engine.arg_utils import EngineArgs


def _args(model: str, **overrides) -> EngineArgs:
    base = dict(model=model, dtype="float32", max_model_len=200,
                kv_cache_memory_bytes=16 << 20)
    return EngineArgs(**dict(base, **overrides))


def test_only_local_ready_models_are_built_early(tmp_path, monkeypatch, tiny_model_factory):
    from vllm.transformers_utils import gguf_utils
    assert core_speculation.builds_without_side_effects(_args(tiny_model_factory("llama")))
    assert not core_speculation.builds_without_side_effects(_args("org/not-downloaded"))
    assert not core_speculation.builds_without_side_effects(_args(str(tmp_path / "missing")))
    # A GGUF file: only once its conversion is in the cache.
    # (setenv, not setattr on vllm.envs: undoing a setattr would leave a fixed module
    # attribute that hides every later VLLM_CACHE_ROOT change)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert not core_speculation.builds_without_side_effects(_args(str(gguf)))
    converted = gguf_utils.converted_dir(str(gguf))
    os.makedirs(converted)
    open(os.path.join(converted, "config.json"), "w").close()
    assert core_speculation.builds_without_side_effects(_args(str(gguf)))
    # The tokenizer counts too.
    local = tiny_model_factory("llama")
    assert not core_speculation.builds_without_side_effects(
        _args(local, tokenizer="org/not-downloaded"))


def test_config_built_early_equals_the_servers(tiny_model_factory):
    args = _args(tiny_model_factory("llama"))
    early = core_speculation.build_config(args)
    assert early is not None
    assert early == args.create_engine_config()
    assert early != _args(args.model, max_model_len=100).create_engine_config()


def test_a_config_that_cannot_be_built_is_dropped_silently(tiny_model_factory, caplog):
    args = _args(tiny_model_factory("llama"), max_model_len=1 << 30)  # beyond the model's
    with pytest.raises(ValueError):
        args.create_engine_config()
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        assert core_speculation.build_config(args) is None
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]
    assert logging.root.manager.disable == logging.NOTSET  # logging is back on


class _Core:
    def __init__(self) -> None:
        self.stopped = False

    def shutdown(self) -> None:
        self.stopped = True


def test_the_early_engine_is_kept_only_when_config_and_environment_are_equal(
        tiny_model_factory, caplog):
    args = _args(tiny_model_factory("llama"))
    config = args.create_engine_config()
    environ = {"A": "1", "B": "2"}

    def early() -> core_speculation.SpeculativeCore:
        return core_speculation.SpeculativeCore(args.create_engine_config(), dict(environ),
                                                _Core())

    same = early()
    assert core_speculation.adopt_or_discard(same, config, dict(environ)) is same.core
    assert not same.core.stopped

    other_env = early()
    with caplog.at_level(logging.WARNING):
        assert core_speculation.adopt_or_discard(other_env, config,
                                                 dict(environ, B="3")) is None
    assert other_env.core.stopped and "environment differs (B)" in caplog.text

    other_config = early()
    smaller = _args(args.model, max_model_len=100).create_engine_config()
    why = core_speculation.mismatch(other_config, smaller, dict(environ))
    assert why.startswith("the config differs (") and "model_config" in why
    assert core_speculation.adopt_or_discard(other_config, smaller, dict(environ)) is None
    assert other_config.core.stopped
    assert core_speculation.adopt_or_discard(None, config, environ) is None


def test_start_keeps_the_config_as_it_was_before_initialization(tiny_model_factory):
    args = _args(tiny_model_factory("llama"))
    config = args.create_engine_config()
    early = core_speculation.start(config)
    assert early is not None
    try:
        assert early.core.vllm_config is config
        assert config.cache_config.num_gpu_blocks  # the initialization sized the cache
        assert early.config == args.create_engine_config()  # ... the snapshot is pristine
        assert early.environ == dict(os.environ)
    finally:
        early.core.shutdown()


def test_start_drops_an_engine_that_fails_to_initialize(tiny_model_factory):
    config = _args(tiny_model_factory("llama")).create_engine_config()
    config.cache_config.kv_cache_memory_bytes = 1  # not one KV block
    assert core_speculation.start(config) is None
