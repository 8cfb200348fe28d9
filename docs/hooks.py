"""mkdocs hook: show each example's `<!-- needs: ... -->` marker to the reader.

The markers say why the test suite does not run a block (tests/docs/test_docs_examples.py
runs every other Python and shell block on CPU); on the site each becomes a visible
"Needs: ..." note above its block. The vocabulary is REASONS in docs/examples.py.
"""
from __future__ import annotations

import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "docs_examples", os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples.py"))
examples = importlib.util.module_from_spec(_spec)
sys.modules["docs_examples"] = examples  # dataclasses look their module up
_spec.loader.exec_module(examples)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - mkdocs API
    return examples.render_markers(markdown)
