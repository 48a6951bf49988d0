"""Model registry: manifests and content-addressed blobs on disk, remote fetch (HuggingFace, Ollama registry,
HTTP(S), local files), pull jobs and search."""

from .errors import RegistryError
from .records import ModelRecord
from .store import DEFAULT_MODEL, Registry

__all__ = ["Registry", "RegistryError", "ModelRecord", "DEFAULT_MODEL"]
