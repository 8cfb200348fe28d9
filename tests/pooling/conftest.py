"""Tiny pooling models (random weights, saved by transformers) shared by the pooling tests."""
from __future__ import annotations

import pytest

from tests.pooling._pooling_models import make_tiny_encoder


@pytest.fixture(scope="session")
def encoder_factory(tmp_path_factory):
    """encoder_factory(kind, pooling=None, **config) -> path (kinds: _pooling_models.py)."""
    cache: dict = {}

    def factory(kind: str, pooling: str | None = None, **overrides) -> str:
        key = (kind, pooling, tuple(sorted(overrides.items())))
        if key not in cache:
            directory = str(tmp_path_factory.mktemp(f"tiny-{kind}"))
            cache[key] = make_tiny_encoder(directory, kind, pooling, **overrides)
        return cache[key]

    return factory
