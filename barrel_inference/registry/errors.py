"""Typed registry errors: a stable `code` for programs, a plain sentence for people."""

from __future__ import annotations

# code -> HTTP status an API should answer with when the error reaches a client
_STATUS = {
    "model_not_found": 404,
    "enoent": 404,
    "invalid_name": 400,
    "forbidden_address": 403,
    "unsupported_spec": 400,
    "bad_hf_spec": 400,
    "bad_ollama_spec": 400,
    "hf_no_gguf": 404,
    "http_status": 502,
    "ollama_manifest_status": 502,
    "ollama_no_model_layer": 400,
    "sha256_mismatch": 502,
    "size_mismatch": 502,
    "not_gguf": 400,
    "network": 502,
    "timeout": 504,
    "exists": 409,
    "bad_gguf": 400,
    "job_not_found": 404,
    "invalid_request": 400,
    "cancelled": 499,
    "internal": 500,
}


class RegistryError(Exception):
    """A registry or fetch failure.

    `code` is one of: model_not_found, enoent, invalid_name, unsupported_spec, bad_hf_spec, bad_ollama_spec,
    hf_no_gguf, http_status (detail: status, url), ollama_manifest_status (detail: status), ollama_no_model_layer,
    sha256_mismatch (detail: got, want), size_mismatch, not_gguf, bad_gguf, network, timeout, exists, job_not_found.
    """

    def __init__(self, code: str, message: str, **detail):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail

    @property
    def status(self) -> int:
        """The HTTP status that fits this error; for an upstream 404 it is 404, else the table above."""
        if self.code in ("http_status", "ollama_manifest_status") and self.detail.get("status") == 404:
            return 404
        if self.code in ("http_status", "ollama_manifest_status") and self.detail.get("status") in (401, 403):
            return 403
        return _STATUS.get(self.code, 500)

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, **self.detail}

    def __repr__(self) -> str:
        return f"RegistryError({self.code!r}, {self.message!r})"


def model_not_found(name: str) -> RegistryError:
    return RegistryError("model_not_found", f"model '{name}' not found; pull it first (bictl pull {name})", name=name)
