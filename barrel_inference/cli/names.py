"""Model-name help for errors: one wording for an unknown model, with a did-you-mean from the daemon's list."""

from __future__ import annotations

import difflib

from .client import CLIError


def suggestions(name: str, names: list[str], n: int = 3) -> list[str]:
    """The known names closest to `name` (with and without their tags)."""
    bare = {m.split(":", 1)[0] if m.endswith(":latest") else m: m for m in names}
    candidates = {**{m: m for m in names}, **bare}
    close = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)
    out: list[str] = []
    for c in close:
        if candidates[c] not in out:
            out.append(candidates[c])
    return out


def not_found_message(name: str, names: list[str]) -> str:
    """The one wording of an unknown model."""
    close = suggestions(name, names)
    if close:
        options = " or ".join(f"'{c}'" for c in close)
        return f"model '{name}' not found — did you mean {options}? (`bictl list` shows them all)"
    return f"model '{name}' not found — see `bictl list`, or pull it with `bictl pull {name}`"


def model_hint(state, exc: CLIError, name: str) -> CLIError:
    """A 404 about a model becomes the one not-found wording (with did-you-mean); other errors pass unchanged."""
    if exc.status != 404 or "not found" not in exc.message:
        return exc
    try:
        names = [m["name"] for m in (state.client(timeout=5).call("GET", "/api/tags") or {}).get("models", [])]
    except (CLIError, KeyError, TypeError):
        names = []
    return CLIError(not_found_message(name, names), status=404, exit_code=exc.exit_code)
