from __future__ import annotations

import pytest

from tinymodel import write_tiny_gguf


@pytest.fixture(scope="session")
def gguf_blobs(tmp_path_factory) -> list[bytes]:
    """Four distinct tiny GGUF files as bytes (about 470 KB each)."""
    d = tmp_path_factory.mktemp("blobs")
    return [write_tiny_gguf(d / f"m{i}.gguf", seed=i).read_bytes() for i in range(4)]
