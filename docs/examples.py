"""The docs' code blocks: which run in the test suite, and why the others do not.

Every ```python, ```bash, ```shell, ```sh and ```console block of docs/*.md either runs on
CPU in tests/docs/test_docs_examples.py or follows a marker naming what it needs:

    <!-- needs: gaudi -->            (one or more REASONS, comma-separated)

Other markers:

    <!-- docs-server: [ENV=VALUE ...] [server flags] -->   (once per page, anywhere)
        the page's blocks talk to a server: the test starts one (the default model plus
        these flags and variables) and points `localhost:8000` at it
    <!-- expect-failure -->   the next block shows an error: it runs and must fail
    <!-- docs-own-process -->  the page's Python blocks change the process for good
                               (a custom-op plugin, ...): they run in a process of their own

The mkdocs hook (docs/hooks.py) renders each `needs` marker as a visible note.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Optional

REASONS = {
    "gaudi": "an Intel Gaudi machine",
    "gpu": "an NVIDIA GPU",
    "hub-model": "a model from the Hugging Face Hub (downloaded, or in the cache)",
    "multi-node": "several machines, or a Ray cluster",
    "docker": "Docker",
    "long-running": "minutes of running, or runs until stopped (a server)",
    "your-files": "your own model, adapter or files (the paths are placeholders)",
    "other-server": "a server started as shown on this page, in another terminal",
    "network": "access to the internet or another host",
}
"""Marker name -> what the reader is told the block needs."""

RUN_LANGS = {"python", "py", "bash", "shell", "sh", "console"}
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_NEEDS = re.compile(r"^\s*<!--\s*needs:(.*?)-->\s*$")
_SERVER = re.compile(r"^\s*<!--\s*docs-server:(.*?)-->\s*$")
_EXPECT_FAIL = re.compile(r"^\s*<!--\s*expect-failure\s*-->\s*$")
_OWN_PROCESS = re.compile(r"^\s*<!--\s*docs-own-process\s*-->\s*$")


@dataclass
class Block:
    page: str
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    needs: list[str] = field(default_factory=list)
    expect_failure: bool = False

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and not self.needs

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Page:
    path: str
    blocks: list[Block]
    server: Optional[tuple[tuple[str, ...], tuple[tuple[str, str], ...]]]  # (flags, env)
    errors: list[str]
    own_process: bool = False


def parse(text: str, path: str = "<page>") -> Page:
    """The page's fenced blocks with their markers, and the marker mistakes found."""
    lines = text.split("\n")
    blocks: list[Block] = []
    errors: list[str] = []
    server = None
    own_process = False
    pending: Optional[tuple[int, list[str]]] = None
    expect_failure = False
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
            body = []
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            block = Block(path, i + 1, lang, "\n".join(body) + "\n")
            if pending is not None:
                if lang not in RUN_LANGS:
                    errors.append(f"{path}:{pending[0]}: a needs marker before a "
                                  f"```{lang or '(plain)'} block, which never runs")
                block.needs = pending[1]
                pending = None
            block.expect_failure, expect_failure = expect_failure, False
            blocks.append(block)
            i = j + 1
            continue
        m = _NEEDS.match(line)
        if m:
            reasons = [r.strip() for r in m.group(1).split(",") if r.strip()]
            if not reasons:
                errors.append(f"{path}:{i + 1}: a needs marker without a reason "
                              f"(one of {', '.join(REASONS)})")
            for r in reasons:
                if r not in REASONS:
                    errors.append(f"{path}:{i + 1}: unknown reason {r!r} "
                                  f"(one of {', '.join(REASONS)})")
            if pending is not None:
                errors.append(f"{path}:{pending[0]}: a needs marker not followed by a block")
            pending = (i + 1, reasons or ["?"])
        elif _SERVER.match(line):
            words = shlex.split(_SERVER.match(line).group(1))
            env = tuple((w.split("=", 1)[0], w.split("=", 1)[1]) for w in words
                        if re.match(r"^[A-Z_][A-Z0-9_]*=", w))
            flags = tuple(w for w in words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w))
            server = (flags, env)
        elif _EXPECT_FAIL.match(line):
            expect_failure = True
        elif _OWN_PROCESS.match(line):
            own_process = True
        elif "--8<--" in line and pending is None:
            errors.append(f"{path}:{i + 1}: an included file (--8<--) needs a needs marker "
                          "before it: its blocks are not run")
        elif "--8<--" in line:
            pending = None
        elif line.strip() and pending is not None and not line.lstrip().startswith("<!--"):
            errors.append(f"{path}:{pending[0]}: a needs marker followed by text, not a block")
            pending = None
        i += 1
    if pending is not None:
        errors.append(f"{path}:{pending[0]}: a needs marker not followed by a block")
    return Page(path, blocks, server, errors, own_process)


def render_markers(markdown: str) -> str:
    """Each `<!-- needs: a, b -->` line outside code blocks becomes a visible note (the
    site's rendering)."""
    out, fence = [], None
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if m and fence is None:
            fence = m.group(2)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None and _NEEDS.match(line):
            indent = line[:len(line) - len(line.lstrip())]
            reasons = [r.strip() for r in _NEEDS.match(line).group(1).split(",") if r.strip()]
            what = "; ".join(REASONS.get(r, r) for r in reasons) or "(reason missing)"
            if out and out[-1].strip():
                out.append("")      # an admonition starts a block of its own
            out += [f'{indent}!!! note "Needs: {what}"', f"{indent}    Not run by the test suite.",
                    ""]
            continue
        out.append(line)
    return "\n".join(out)
