"""An early-forked engine core that initializes before the server sends it the config.

Why: the server forks its engine core early (core_launch.py), and the core used to wait
for the server's config before it loaded the model. Building the config is mostly
importing transformers (seconds); once imported, the config itself takes milliseconds.
So where it is safe, the server builds the config just before the fork: the core
inherits it (and transformers, imported once instead of once per process) and
initializes (weights, packing, KV cache) while the server imports its web stack, loads
its tokenizer and builds its engine, which builds the config a second time, from the
same arguments, and sends it as before.

Why it stays correct: the core serves with what it initialized only when the config it
started from equals the one the server sends (as it was before initialization changed
it) and its environment equals the server's at that moment; otherwise it discards its
engine and initializes from the server's config, as without this. A config that fails
to build before the fork is dropped silently (the server builds it again and reports
its own error), and so is an engine that fails to initialize from it (the server's
config reproduces the failure, which is reported the usual way).

Only where building the config has no side effect worth doing early: the model and the
tokenizer must be local (a directory, or a GGUF file already converted). A first start,
which converts the GGUF file or downloads the model, forks first and lets the core
build the native kernels meanwhile, as before.
"""
from __future__ import annotations

import copy
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

logger = logging.getLogger(__name__)


@dataclass
class SpeculativeCore:
    """An engine core initialized before the server's config arrived."""
    config: Any
    """The config as it was before the core's initialization filled in its KV cache
    size: what the server's config must equal."""
    environ: dict[str, str]
    """This process's environment when the initialization began."""
    core: Any
    """The initialized EngineCore (it holds the config it changed)."""


def builds_without_side_effects(engine_args: Any) -> bool:
    """Whether resolving the model and the tokenizer reads only local, ready files (no
    download, no GGUF conversion): only then is the config built before the fork (a
    download or a conversion there would delay the core's start, and with it the
    kernel build a first start overlaps with them)."""
    from vllm.config import DEFAULT_MODEL
    from vllm.transformers_utils.config import embedded_default_model_path
    names = [engine_args.model] + ([engine_args.tokenizer] if engine_args.tokenizer else [])
    for name in names:
        path = name
        if name == DEFAULT_MODEL and not os.path.exists(name):
            try:
                path = embedded_default_model_path()
            except ValueError:
                return False
        if not _local_and_ready(path):
            return False
    return True


def _local_and_ready(path: str) -> bool:
    if os.path.isdir(path):
        return True
    if path.endswith(".gguf") and os.path.isfile(path):
        from vllm.transformers_utils.gguf_utils import converted_dir
        return os.path.isfile(os.path.join(converted_dir(path), "config.json"))
    return False


def build_config(engine_args: Any) -> Optional[Any]:
    """`engine_args.create_engine_config()` without its log lines (the server logs its
    own build), or None when it fails or would download or convert a model."""
    if not builds_without_side_effects(engine_args):
        return None
    try:
        with _quiet_logging():
            return copy.deepcopy(engine_args).create_engine_config()
    except Exception:  # noqa: BLE001 - the server builds it again and reports its error
        logger.debug("Building the engine config before the fork failed.", exc_info=True)
        return None


@contextmanager
def _quiet_logging() -> Iterator[None]:
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def start(vllm_config: Any) -> Optional[SpeculativeCore]:
    """Initialize an EngineCore from `vllm_config` (kept as it was: the core's
    initialization changes the config it holds); None when that fails (the caller
    waits for the server's config, as without this)."""
    built = copy.deepcopy(vllm_config)
    environ = dict(os.environ)
    try:
        from vllm.engine.core import EngineCore
        core = EngineCore(vllm_config)
    except Exception:  # noqa: BLE001 - the server's config reproduces it, reported then
        logger.debug("Initializing the engine core before the server's config arrived "
                     "failed.", exc_info=True)
        return None
    return SpeculativeCore(built, environ, core)


def mismatch(speculative: SpeculativeCore, vllm_config: Any,
             environ: dict[str, str]) -> Optional[str]:
    """Why the server's config and environment differ from the ones the core was built
    with (None when they are equal)."""
    if speculative.environ != environ:
        names = sorted(set(speculative.environ.items()) ^ set(environ.items()))
        return "the environment differs (%s)" % ", ".join(sorted({k for k, _ in names}))
    if speculative.config != vllm_config:
        return "the config differs (%s)" % ", ".join(_differing_fields(speculative.config,
                                                                       vllm_config))
    return None


def _differing_fields(a: Any, b: Any) -> list[str]:
    import dataclasses
    if not (dataclasses.is_dataclass(a) and type(a) is type(b)):
        return [type(a).__name__]
    return [f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)]


def adopt_or_discard(speculative: Optional[SpeculativeCore], vllm_config: Any,
                     environ: dict[str, str]) -> Optional[Any]:
    """The speculative EngineCore when the server's config and environment equal its own
    (the server's config object learns nothing new: the core reports its KV cache size
    when it is ready), else None after shutting it down."""
    if speculative is None:
        return None
    why = mismatch(speculative, vllm_config, environ)
    if why is None:
        logger.debug("Engine core initialized before the server's config arrived (equal).")
        return speculative.core
    logger.warning("The engine core's early config does not match the server's: %s; "
                   "initializing again from the server's.", why)
    try:
        speculative.core.shutdown()
    except Exception:  # noqa: BLE001 - discarded anyway
        logger.debug("Shutting down the discarded engine core failed.", exc_info=True)
    return None
