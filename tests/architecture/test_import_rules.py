"""The "never" arrows of the architecture (docs: ARCHITECTURE.md, "Data flow"), checked
over the import graph of `vllm/`, imports inside functions and under TYPE_CHECKING
included. A failure prints each offending import as `importer -> imported (line N)`.

Rules are written by package (not by file), so moving files inside a package or into
`vllm/hpu/` keeps them meaningful.

Cycles: no two modules may import each other at module level (a cycle there makes the
import order matter). Function-level imports are lazy by design (heavy or optional
dependencies, platform-specific code), so a lazy cycle *inside one package* is that
package's business; a cycle that crosses packages, lazy or not, means two layers each
reach into the other, and is refused.
"""
from __future__ import annotations

import os
import textwrap

import pytest

from tests.architecture.import_graph import ImportGraph, Rule, chain_to, check, in_package

VLLM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "vllm")

BACKENDS = ("vllm.cpu", "vllm.hpu", "vllm.cuda", "vllm.native")
"""The backend packages: each binds its kernels to the model code (CustomOp forwards,
model_executor/kernels.py); none is imported by it. `vllm.native` is the CPU
backend's old name, kept here so that it cannot come back."""

RULES = (
    Rule(
        name="the scheduler touches no tensors and knows nothing of models or workers",
        importers=("vllm.core",),
        forbidden=("vllm.model_executor", "vllm.worker", "vllm.hpu", "vllm.attention",
                   "vllm.executor", "vllm.sample", "vllm.cpu", "vllm.cuda", "vllm.distributed"),
        external_forbidden=("torch",)),
    Rule(
        name="the server reaches the engine only through EngineClient",
        importers=("vllm.entrypoints.openai", "vllm.entrypoints.anthropic"),
        forbidden=("vllm.engine", "vllm.core", "vllm.executor", "vllm.worker",
                   "vllm.model_executor", "vllm.hpu", "vllm.attention", "vllm.sample",
                   "vllm.distributed", "vllm.cpu", "vllm.cuda"),
        allowed={
            "vllm.engine.protocol":
                "EngineClient and EngineDeadError: the contract itself",
            "vllm.engine.params":
                "the request-parameter rules and the errors the engine raises with them "
                "(pure functions of the model config, no engine state): the server words "
                "those errors for its API, and frontend-driven beam search needs its length "
                "up front",
            "vllm.engine.arg_utils":
                "the server parses the engine's command-line flags (EngineArgs)",
            "vllm.entrypoints.openai.api_server -> vllm.engine.dp_engine":
                "the process entry point builds the engine client it serves "
                "(build_async_engine), as vLLM's build_async_engine_client",
            "vllm.entrypoints.openai.run_batch -> vllm.engine.dp_engine":
                "`vllm run-batch` is a process entry point too: it builds the engine "
                "client its in-process app serves",
            "vllm.entrypoints.openai.core_prestart -> vllm.engine.dp_engine":
                "the server process's first lines fork the engine core before the web "
                "stack loads (prestart_engine_core), the same entry point as api_server's",
            "vllm.entrypoints.openai.api_server -> vllm.engine.metrics":
                "/metrics renders the client's Prometheus registry "
                "(EngineClient.metrics_registry) as text; no engine state",
        }),
    Rule(
        name="models know nothing of the engine or the server",
        importers=("vllm.model_executor",),
        forbidden=("vllm.engine", "vllm.entrypoints", "vllm.core", "vllm.executor")),
    Rule(
        name="model, attention and sampling code import no backend package",
        importers=("vllm.model_executor", "vllm.attention", "vllm.sample"),
        forbidden=BACKENDS),
    Rule(
        name="config holds values: it imports nothing above it",
        importers=("vllm.config",),
        only=("vllm.envs", "vllm.logger", "vllm.utils", "vllm.version", "vllm.platforms",
              "vllm.reasoning"),
        allowed={
            "vllm.platforms":
                "the platform supplies defaults (block size, auto dtype) and adjusts the "
                "finished config; it refers to the config only for type hints",
            "vllm.reasoning":
                "the reasoning parser name is checked against the parsers' registry "
                "(a leaf package: it imports nothing of vllm but its own modules)",
        }),
)


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return ImportGraph.from_package(VLLM_DIR)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_layer_rule(graph: ImportGraph, rule: Rule) -> None:
    report = check(graph, [rule])
    assert not report, "\n" + "\n".join(report)


def test_rules_cover_real_modules(graph: ImportGraph) -> None:
    """A rule whose importers match nothing (a renamed package) would pass vacuously."""
    for rule in RULES:
        for importer in rule.importers:
            assert any(m == importer or m.startswith(importer + ".") for m in graph.modules), \
                f"{rule.name}: no module under {importer}"


def test_scheduler_reaches_no_model_code(graph: ImportGraph) -> None:
    """Not even through another module: the review found the scheduler reaching
    model_executor through config.py (quantization config built in ModelConfig)."""
    reached = graph.reachable("vllm.core", lazy=True)
    model_side = ("vllm.model_executor", "vllm.worker", "vllm.hpu", "vllm.attention",
                  "vllm.cpu", "vllm.cuda")
    bad = sorted(m for m in reached if any(in_package(m, p) for p in model_side))
    assert not bad, "\n" + "\n".join(
        " | ".join(str(e) for e in chain_to(reached, m)) for m in bad)


def test_no_module_level_cycles(graph: ImportGraph) -> None:
    cycles = graph.cycles()
    assert not cycles, "\n" + "\n".join(_describe(graph, c, lazy=False) for c in cycles)


def test_no_cross_package_cycles(graph: ImportGraph) -> None:
    """Lazy (function-level) imports included: a cycle must stay inside one package."""
    crossing = [c for c in graph.cycles(lazy=True) if len({_package(m) for m in c}) > 1]
    assert not crossing, "\n" + "\n".join(_describe(graph, c, lazy=True) for c in crossing)


LAZY_CYCLES_LEFT = (
    {"vllm.hpu.bucket_planner", "vllm.hpu.bucket_trace", "vllm.hpu.bucketing",
     "vllm.hpu.prompt_grouping"},
)
"""Function-level cycles inside one package still to be taken apart (issue 45 item 7);
each entry must still be a cycle (a stale entry fails), and no other may appear."""


def test_no_function_level_cycles(graph: ImportGraph) -> None:
    """Lazy imports included, a cycle even inside one package means its modules cannot
    be read (or moved) one without the other: the rotary factory and its variants,
    fp8 and block-fp8, the platforms and the plugins were such knots."""
    cycles = [set(c) for c in graph.cycles(lazy=True)]
    new = [c for c in cycles if c not in LAZY_CYCLES_LEFT]
    assert not new, "\n" + "\n".join(_describe(graph, sorted(c), lazy=True) for c in new)
    stale = [c for c in LAZY_CYCLES_LEFT if c not in cycles]
    assert not stale, f"no longer cycles, drop them from LAZY_CYCLES_LEFT: {stale}"


def test_config_processor_structured_output_loop_is_gone(graph: ImportGraph) -> None:
    """The loop a review found: config -> engine.processor -> structured_output -> config."""
    for cycle in graph.cycles(lazy=True):
        assert "vllm.config" not in cycle, _describe(graph, cycle, lazy=True)


def _package(module: str) -> str:
    return module.rpartition(".")[0]


def _describe(graph: ImportGraph, cycle: list[str], lazy: bool) -> str:
    members = set(cycle)
    scopes = ("module", "function") if lazy else ("module",)
    lines = [f"cycle among {', '.join(cycle)}:"]
    lines += [f"  {e}" for e in graph.edges
              if e.importer in members and e.imported in members and e.scope in scopes]
    return "\n".join(lines)


# --------------------------------------------------- the checker itself can fail
def _write(root, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return str(root / "vllm")


def test_checker_reports_each_kind_of_import(tmp_path) -> None:
    pkg = _write(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/config.py": "",
        "vllm/core/__init__.py": "",
        "vllm/core/scheduler.py": """\
            import importlib
            from typing import TYPE_CHECKING
            from vllm.config import X
            from ..model_executor import layers
            if TYPE_CHECKING:
                from vllm.worker.runner import Runner

            def f():
                import torch
                return importlib.import_module("vllm.hpu.ops")
            """,
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/layers.py": "",
        "vllm/worker/__init__.py": "",
        "vllm/worker/runner.py": "",
        "vllm/hpu/__init__.py": "",
        "vllm/hpu/ops.py": "",
    })
    graph = ImportGraph.from_package(pkg)
    report = check(graph, RULES[:1])
    assert report[0].startswith("the scheduler touches no tensors")
    assert report[1:] == [
        "  vllm.core.scheduler -> vllm.model_executor.layers (line 4)",
        "  vllm.core.scheduler -> vllm.worker.runner (line 6)",
        "  vllm.core.scheduler -> torch (line 9)",
        "  vllm.core.scheduler -> vllm.hpu.ops (line 10)",
    ]


def test_checker_allows_listed_arrows_only(tmp_path) -> None:
    pkg = _write(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/engine/__init__.py": "",
        "vllm/engine/protocol.py": "",
        "vllm/engine/core.py": "",
        "vllm/entrypoints/__init__.py": "",
        "vllm/entrypoints/openai/__init__.py": "",
        "vllm/entrypoints/openai/serving.py": """\
            from vllm.engine.protocol import EngineClient
            from vllm.engine import core
            """,
    })
    report = check(ImportGraph.from_package(pkg), [RULES[1]])
    assert report[1:] == ["  vllm.entrypoints.openai.serving -> vllm.engine.core (line 2)"]


def test_checker_follows_import_chains(tmp_path) -> None:
    pkg = _write(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/config.py": "def q():\n    from vllm.model_executor import quant\n",
        "vllm/core/__init__.py": "",
        "vllm/core/scheduler.py": "from vllm.config import C\n",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/quant.py": "",
    })
    graph = ImportGraph.from_package(pkg)
    reached = graph.reachable("vllm.core")
    assert [str(e) for e in chain_to(reached, "vllm.model_executor.quant")] == [
        "vllm.core.scheduler -> vllm.config (line 1)",
        "vllm.config -> vllm.model_executor.quant (line 2)"]
    assert "vllm.model_executor.quant" not in graph.reachable("vllm.core", lazy=False)


def test_checker_finds_cycles(tmp_path) -> None:
    pkg = _write(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/config.py": "def load():\n    from vllm.engine.processor import p\n",
        "vllm/engine/__init__.py": "",
        "vllm/engine/processor.py": "from vllm.config import C\n",
        "vllm/a/__init__.py": "",
        "vllm/a/x.py": "from vllm.a import y\n",
        "vllm/a/y.py": "from . import x\n",
    })
    graph = ImportGraph.from_package(pkg)
    assert graph.cycles() == [["vllm.a.x", "vllm.a.y"]]
    assert sorted(graph.cycles(lazy=True)) == [["vllm.a.x", "vllm.a.y"],
                                               ["vllm.config", "vllm.engine.processor"]]
    assert "vllm.config -> vllm.engine.processor (line 2)" in _describe(
        graph, ["vllm.config", "vllm.engine.processor"], lazy=True)


def test_checker_refuses_a_backend_import_in_model_code(tmp_path) -> None:
    """The backend rule fails on each way model, attention or sampling code could
    reach a backend: a module-level import, a relative one, one inside a function."""
    pkg = _write(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/kernels.py": "",
        "vllm/model_executor/models/__init__.py": "",
        "vllm/model_executor/models/llama.py": """\
            from vllm.model_executor.kernels import linear
            from vllm.cpu.gemm import drop_packed_weights
            """,
        "vllm/attention/__init__.py": "",
        "vllm/attention/mla.py": "from ..hpu import ops\n",
        "vllm/sample/__init__.py": "",
        "vllm/sample/metadata.py": """\
            def greedy(logits):
                from vllm.cuda import ops
                return ops
            """,
        "vllm/cpu/__init__.py": "",
        "vllm/cpu/gemm.py": "from vllm.model_executor.kernels import linear\n",
        "vllm/hpu/__init__.py": "",
        "vllm/hpu/ops.py": "",
        "vllm/cuda/__init__.py": "",
        "vllm/cuda/ops.py": "",
    })
    rule = next(r for r in RULES if r.importers == ("vllm.model_executor", "vllm.attention",
                                                    "vllm.sample"))
    report = check(ImportGraph.from_package(pkg), [rule])
    assert report[0].startswith("model, attention and sampling code import no backend")
    assert sorted(report[1:]) == [
        "  vllm.attention.mla -> vllm.hpu.ops (line 1)",
        "  vllm.model_executor.models.llama -> vllm.cpu.gemm (line 2)",
        "  vllm.sample.metadata -> vllm.cuda.ops (line 2)",
    ]
