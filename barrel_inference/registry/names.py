"""Model names: `name[:tag]`, where name may have '/'-separated parts (e.g. `hf.co/org/repo`)."""

from __future__ import annotations

import re

from .errors import RegistryError

DEFAULT_TAG = "latest"
MAX_NAME = 256  # a whole name; its parts become directories and file names in the cache
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def split_name(name: str) -> tuple[str, str]:
    """'gemma3:270m' -> ('gemma3', '270m'); 'gemma3' -> ('gemma3', 'latest'). Validates both parts."""
    raw = name
    if len(name) > MAX_NAME:
        raise RegistryError("invalid_name", f"a model name is at most {MAX_NAME} characters, got {len(name)}", name=raw[:64] + "…")
    name = name.strip()
    # the tag is after the last ':' that follows the last '/', so 'host:port/x' keeps its port
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        base, tag = name[:colon], name[colon + 1 :]
    else:
        base, tag = name, DEFAULT_TAG
    parts = base.split("/")
    if not base or not all(_PART.match(p) and p not in (".", "..") for p in parts):
        raise RegistryError("invalid_name", f"'{raw}' is not a valid model name (use letters, digits, '_', '-', '.', '/' and one ':tag')", name=raw)
    if not _TAG.match(tag):
        raise RegistryError("invalid_name", f"'{tag}' is not a valid tag in model name '{raw}'", name=raw)
    return base, tag


def normalize(name: str) -> str:
    """The canonical 'name:tag' form."""
    base, tag = split_name(name)
    return f"{base}:{tag}"


def sanitize_part(text: str) -> str:
    """Turn arbitrary text (a file stem, a repo name) into a valid name part."""
    out = re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-.") or "model"
    if not re.match(r"[A-Za-z0-9_]", out[0]):
        out = "m" + out
    return out[:128]


def sanitize_tag(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or DEFAULT_TAG
    if not re.match(r"[A-Za-z0-9_]", out[0]):
        out = "t" + out
    return out[:128]
