"""Pull specs: where a model comes from.

    hf://org/repo/path/file.gguf[@rev]   one file of a HuggingFace repo (rev defaults to main)
    hf://org/repo[@rev]                  auto-pick: Q4_K_M > Q5_K_M > Q4_0 > Q8_0, else the first .gguf
    hf.co/org/repo[:QUANT]               Ollama's spelling of the same (QUANT picks the file)
    ollama://[namespace/]name[:tag]      Ollama registry (namespace defaults to library)
    name[:tag], namespace/name[:tag]     the same, as the `ollama` client writes it
    https://… , http://…                 any URL serving a GGUF
    file:///abs/path.gguf, /abs/path     a local file, registered in place (passthrough)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .errors import RegistryError
from .names import DEFAULT_TAG, sanitize_part, sanitize_tag

MAX_SPEC = 2048  # a path or URL longer than this is no file name the system would accept either
QUANT_PREFERENCE = ("Q4_K_M", "Q5_K_M", "Q4_0", "Q8_0")
_QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)(?![A-Za-z0-9])", re.I)
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.I)
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_OLLAMA_PART = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$", re.I)
_OLLAMA_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


@dataclass(frozen=True)
class HFSpec:
    org: str
    repo: str
    path: str | None = None  # None: auto-pick
    rev: str = "main"
    quant: str | None = None  # hf.co/org/repo:QUANT
    kind: str = "hf"

    @property
    def repo_id(self) -> str:
        return f"{self.org}/{self.repo}"

    @property
    def canonical(self) -> str:
        base = f"hf://{self.repo_id}" + (f"/{self.path}" if self.path else "")
        if self.quant and not self.path:
            base += f":{self.quant}"
        return base + (f"@{self.rev}" if self.rev != "main" else "")

    def with_path(self, path: str) -> "HFSpec":
        return HFSpec(self.org, self.repo, path, self.rev, None)

    def default_name(self) -> str:
        tag = self.quant or (quant_of(self.path) if self.path else None) or (sanitize_tag(Path(self.path).stem) if self.path else DEFAULT_TAG)
        return f"hf.co/{sanitize_part(self.org)}/{sanitize_part(self.repo)}:{sanitize_tag(tag)}"


@dataclass(frozen=True)
class OllamaSpec:
    namespace: str
    name: str
    tag: str = DEFAULT_TAG
    kind: str = "ollama"

    @property
    def canonical(self) -> str:
        return f"ollama://{self.namespace}/{self.name}:{self.tag}"

    def default_name(self) -> str:
        base = self.name if self.namespace == "library" else f"{self.namespace}/{self.name}"
        return f"{base}:{self.tag}"


@dataclass(frozen=True)
class URLSpec:
    url: str
    kind: str = "url"

    @property
    def canonical(self) -> str:
        return self.url

    def default_name(self) -> str:
        stem = Path(unquote(urlsplit(self.url).path)).name
        stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
        return f"{sanitize_part(stem.lower())}:{DEFAULT_TAG}"


@dataclass(frozen=True)
class FileSpec:
    path: Path
    kind: str = "file"

    @property
    def canonical(self) -> str:
        return self.path.as_uri()

    def default_name(self) -> str:
        stem = self.path.name[:-5] if self.path.name.lower().endswith(".gguf") else self.path.name
        return f"{sanitize_part(stem.lower())}:{DEFAULT_TAG}"


Spec = HFSpec | OllamaSpec | URLSpec | FileSpec


def quant_of(filename: str | None) -> str | None:
    """The quantisation named in a file name ('model-Q4_K_M.gguf' -> 'Q4_K_M')."""
    if not filename:
        return None
    found = _QUANT_RE.findall(Path(filename).name)
    return found[-1].upper() if found else None


def is_split_gguf(filename: str) -> bool:
    return bool(_SPLIT_RE.search(filename))


def pick_gguf(files: list[str], quant: str | None = None) -> str | None:
    """Choose the file to pull from a repo listing: the named quant, else by preference, else the first .gguf."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and not is_split_gguf(f) and "mmproj" not in f.lower())
    if quant:
        matches = [f for f in ggufs if quant_of(f) == quant.upper()]
        return matches[0] if matches else None
    for q in QUANT_PREFERENCE:
        for f in ggufs:
            if quant_of(f) == q:
                return f
    return ggufs[0] if ggufs else None


def _parse_hf(rest: str, raw: str, *, ollama_style: bool = False) -> HFSpec:
    rev = "main"
    quant = None
    if "@" in rest:
        rest, rev = rest.rsplit("@", 1)
        if not _REV.match(rev) or ".." in rev:
            raise RegistryError("bad_hf_spec", f"'{raw}': '{rev}' is not a valid revision", spec=raw)
    parts = [p for p in rest.split("/")]
    if ollama_style and len(parts) == 2 and ":" in parts[1]:
        parts[1], quant = parts[1].split(":", 1)
        if not quant or not re.match(r"^[A-Za-z0-9_.-]+$", quant):
            raise RegistryError("bad_hf_spec", f"'{raw}': '{quant}' is not a valid quantisation tag", spec=raw)
        if quant.lower() == "latest":
            quant = None
    if len(parts) < 2 or not all(parts[:2]) or not all(_HF_PART.match(p) for p in parts[:2]):
        raise RegistryError("bad_hf_spec", f"'{raw}' is not a HuggingFace spec; write hf://org/repo or hf://org/repo/file.gguf", spec=raw)
    path = "/".join(parts[2:]) or None
    if path is not None:
        if any(p in ("", ".", "..") for p in parts[2:]):
            raise RegistryError("bad_hf_spec", f"'{raw}': '{path}' is not a valid file path in a repo", spec=raw)
        if not path.lower().endswith(".gguf"):
            raise RegistryError("bad_hf_spec", f"'{raw}': only .gguf files can be pulled, not '{path}'", spec=raw)
        if is_split_gguf(path):
            raise RegistryError("bad_hf_spec", f"'{raw}': split GGUF files (…-00001-of-0000N.gguf) are not supported; pick a single-file quantisation", spec=raw)
    return HFSpec(parts[0], parts[1], path, rev, quant)


def _parse_ollama(rest: str, raw: str) -> OllamaSpec:
    tag = DEFAULT_TAG
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["library", parts[0]]
    if len(parts) != 2 or not all(_OLLAMA_PART.match(p) for p in parts) or not _OLLAMA_TAG.match(tag):
        raise RegistryError(
            "bad_ollama_spec", f"'{raw}' is not an Ollama model reference; write ollama://name[:tag] or ollama://namespace/name[:tag]", spec=raw
        )
    return OllamaSpec(parts[0], parts[1], tag)


def parse_spec(text: str) -> Spec:
    """Parse a pull spec; raises RegistryError with code unsupported_spec / bad_hf_spec / bad_ollama_spec / enoent."""
    raw = text
    text = (text or "").strip()
    if len(text) > MAX_SPEC:
        raise RegistryError("unsupported_spec", f"a model spec is at most {MAX_SPEC} characters, got {len(text)}", spec=text[:64] + "…")
    if not text:
        raise RegistryError("unsupported_spec", "an empty model spec; give a name, hf://…, ollama://…, https://… or a path", spec=raw)
    lower = text.lower()
    if lower.startswith("hf://"):
        return _parse_hf(text[5:], raw, ollama_style=True)
    for prefix in ("hf.co/", "huggingface.co/"):
        if lower.startswith(prefix):
            return _parse_hf(text[len(prefix) :], raw, ollama_style=True)
    if lower.startswith("ollama://"):
        return _parse_ollama(text[9:], raw)
    if lower.startswith(("https://", "http://")):
        parts = urlsplit(text)
        if not parts.hostname:
            raise RegistryError("unsupported_spec", f"'{raw}' is not a valid URL", spec=raw)
        return URLSpec(text)
    if lower.startswith("file://"):
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise RegistryError("unsupported_spec", f"'{raw}': file URLs must be local (file:///abs/path)", spec=raw)
        return _file(Path(unquote(parts.path)), raw)
    if text.startswith("/"):
        return _file(Path(text), raw)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise RegistryError(
            "unsupported_spec", f"'{raw}': the scheme '{scheme}://' is not supported; use hf://, ollama://, https://, http:// or file://", spec=raw
        )
    if text.startswith((".", "~")) or text.lower().endswith(".gguf"):
        raise RegistryError("unsupported_spec", f"'{raw}': give local files as an absolute path or a file:/// URL", spec=raw)
    first = text.split("/", 1)[0]
    if "/" in text and "." in first and text.count("/") >= 2:
        raise RegistryError("unsupported_spec", f"'{raw}': pulling from the registry host '{first}' is not supported; use ollama:// or hf://", spec=raw)
    return _parse_ollama(text, raw)


def _file(path: Path, raw: str) -> FileSpec:
    if not path.is_absolute():
        raise RegistryError("unsupported_spec", f"'{raw}': give local files as an absolute path", spec=raw)
    if not path.is_file():
        raise RegistryError("enoent", f"no such file: {path}", spec=raw, path=str(path))
    return FileSpec(path)
