"""An early-forked engine core that builds its own config instead of waiting for the server's.

Why: the server forks its engine core before it builds the config (core_launch.py), and
the core then waited for that config before it loaded the model. Building the config is
mostly importing transformers, which the core imports anyway while it waits; once that
is done, the config itself takes milliseconds. So the core builds the config from the
same engine arguments, right after its imports, and initializes (weights, packing, KV
cache) while the server is still finishing its own config and loading its tokenizer.

Why it stays correct: the server still sends its config and environment. The core
serves with what it built only when both are equal to what the server sent (the config
as it was before initialization changed it, and the whole environment); otherwise it
discards what it built and initializes from the server's config, as before. Nothing a
user sees depends on the speculation: a config that fails to build here is dropped
silently (the server builds it again and reports its own error), and a core that fails
to initialize from its own config is dropped too (the server's config reproduces the
failure and reports it the usual way).

Only where building the config has no side effect worth racing for: the model and the
tokenizer must be local (a directory, or a GGUF file already converted), so that two
processes never download a model or convert a GGUF file at the same time.
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
    """An engine core initialized from a config this process built itself."""
    config: Any
    """The config as built, before the core's initialization filled in its KV cache
    size: what the server's config must equal."""
    environ: dict[str, str]
    """This process's environment when it built the config."""
    core: Any
    """The initialized EngineCore (it holds the config it changed)."""


def builds_without_side_effects(engine_args: Any) -> bool:
    """Whether resolving the model and the tokenizer reads only local, ready files (no
    download, no GGUF conversion): only then may two processes build the config at once."""
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
    """`engine_args.create_engine_config()` with this process's logging silenced (the
    server logs the same build), or None when it fails or must not run here."""
    if not builds_without_side_effects(engine_args):
        return None
    try:
        with _quiet_logging():
            return copy.deepcopy(engine_args).create_engine_config()
    except Exception:  # noqa: BLE001 - the server builds it again and reports its error
        logger.debug("Building the engine config in the core failed.", exc_info=True)
        return None


@contextmanager
def _quiet_logging() -> Iterator[None]:
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def start(engine_args: Any) -> Optional[SpeculativeCore]:
    """Build the config from `engine_args` and initialize an EngineCore from it; None
    when either fails (the caller waits for the server's config, as without this)."""
    config = build_config(engine_args)
    if config is None:
        return None
    built = copy.deepcopy(config)  # the core's initialization changes `config`
    environ = dict(os.environ)
    try:
        from vllm.engine.core import EngineCore
        core = EngineCore(config)
    except Exception:  # noqa: BLE001 - the server's config reproduces it, reported then
        logger.debug("Initializing the engine core from its own config failed.",
                     exc_info=True)
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
        logger.debug("Engine core initialized from its own config (equal to the server's).")
        return speculative.core
    logger.warning("The engine core's own config does not match the server's: %s; "
                   "initializing again from the server's.", why)
    try:
        speculative.core.shutdown()
    except Exception:  # noqa: BLE001 - discarded anyway
        logger.debug("Shutting down the discarded engine core failed.", exc_info=True)
    return None
