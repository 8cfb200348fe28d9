"""The HPU backend's seams, checked over the source (imports inside functions too).

- The stand-ins (`vllm/hpu/habana/fake_*.py`) and the real Gaudi modules
  (`vllm/hpu/habana/real.py`) are reached only through the shim `vllm.hpu.habana`: the
  rest of the backend is then the same code on a Gaudi and off it.
- The warmup is a narrow collaborator: it imports nothing of the model runner (it is
  handed a `WarmupOps`).
- The package's `__init__` imports nothing, so a CPU process that never builds the HPU
  platform loads no HPU code by importing a plugin module.
"""
from __future__ import annotations

import ast
from pathlib import Path

import vllm

ROOT = Path(vllm.__file__).parent
SHIM_INTERNALS = ("vllm.hpu.habana.real", "vllm.hpu.habana.fake_")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """Every module `path` imports (`from a import b` counts as a.b and a), with lines."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else _module_name(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def violations(root: Path, importer_filter, forbidden) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path)
        if not importer_filter(name):
            continue
        out += [f"{name} -> {mod} (line {line})" for mod, line in imported_modules(path)
                if forbidden(mod)]
    return out


def test_the_stand_ins_are_reached_only_through_the_shim():
    bad = violations(ROOT, lambda name: not name.startswith("vllm.hpu.habana"),
                     lambda mod: mod.startswith(SHIM_INTERNALS))
    assert bad == []


def test_the_warmup_does_not_import_the_model_runner():
    assert violations(ROOT / "hpu", lambda name: name == "vllm.hpu.warmup",
                      lambda mod: mod.startswith("vllm.hpu.model_runner")) == []


def test_the_package_init_imports_nothing():
    assert imported_modules(ROOT / "hpu" / "__init__.py") == []


def test_the_checker_sees_a_stand_in_imported_around_the_shim(tmp_path):
    """The check can fail: a module importing a stand-in directly (inside a function,
    relatively) is reported."""
    pkg = tmp_path / "vllm" / "hpu"
    (pkg / "habana").mkdir(parents=True)
    for init in (tmp_path / "vllm" / "__init__.py", pkg / "__init__.py",
                 pkg / "habana" / "__init__.py"):
        init.write_text("")
    (pkg / "runner.py").write_text("def f():\n    from .habana.fake_graphs import x\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path / "vllm"
    try:
        bad = violations(ROOT, lambda name: not name.startswith("vllm.hpu.habana"),
                         lambda mod: mod.startswith(SHIM_INTERNALS))
    finally:
        ROOT = saved
    assert bad == ["vllm.hpu.runner -> vllm.hpu.habana.fake_graphs (line 2)",
                   "vllm.hpu.runner -> vllm.hpu.habana.fake_graphs.x (line 2)"]
