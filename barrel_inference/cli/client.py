"""A small HTTP client for the daemon (stdlib urllib): JSON calls, NDJSON and SSE streams, and errors that say
what to do next."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from ..config import DEFAULT_PORT, load_settings, parse_host

EXIT_FAILED = 1
EXIT_UNREACHABLE = 3


class CLIError(Exception):
    """A failure to report on stderr with exit code `exit_code`."""

    def __init__(self, message: str, *, status: int | None = None, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.message = message
        self.status = status
        self.exit_code = exit_code


def daemon_url(host: str | None = None) -> str:
    """`--host`, else $BARREL_INFERENCE_HOST, else the configured host and port (a bind-all address means local)."""
    if host:
        name, port = parse_host(host)
    else:
        try:
            settings = load_settings()
        except (OSError, ValueError):
            name, port = "127.0.0.1", DEFAULT_PORT
        else:
            name, port = settings.host, settings.port
    if name in ("0.0.0.0", "::", ""):
        name = "127.0.0.1"
    if ":" in name:
        name = f"[{name}]"
    return f"http://{name}:{port or DEFAULT_PORT}"


def _message(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:500] or None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return err.get("message") or json.dumps(err)
    if isinstance(err, str):
        return err
    return None


class Client:
    def __init__(self, base_url: str, timeout: float = 30.0, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.api_key = api_key

    def _open(self, method: str, path: str, body: Any = None, timeout: float | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as exc:
            body = exc.read()
            message = _message(body) or f"HTTP {exc.code} {exc.reason}"
            if exc.code in (401, 403):
                message += (" (bictl sends the key in --api-key or BARREL_INFERENCE_API_KEY" if self.api_key is None
                            else " (the key bictl sent, from --api-key or BARREL_INFERENCE_API_KEY, is not enough")
                message += "; management commands need an admin key)"
            raise CLIError(message, status=exc.code) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (ConnectionRefusedError, FileNotFoundError)) or "refused" in str(reason).lower():
                raise CLIError(f"no daemon at {self.base_url} — start it with `bictl serve`", exit_code=EXIT_UNREACHABLE) from None
            if isinstance(reason, socket.gaierror):
                raise CLIError(f"cannot resolve the daemon's host in {self.base_url}; check BARREL_INFERENCE_HOST", exit_code=EXIT_UNREACHABLE) from None
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise CLIError(f"the daemon at {self.base_url} did not answer in time", exit_code=EXIT_UNREACHABLE) from None
            raise CLIError(f"cannot reach the daemon at {self.base_url}: {reason}", exit_code=EXIT_UNREACHABLE) from None
        except (TimeoutError, socket.timeout):
            raise CLIError(f"the daemon at {self.base_url} did not answer within {timeout or self.timeout:g}s", exit_code=EXIT_UNREACHABLE) from None
        except ConnectionError as exc:
            raise CLIError(f"the connection to the daemon at {self.base_url} failed: {exc}", exit_code=EXIT_UNREACHABLE) from None

    def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """One request; the decoded JSON answer (None for an empty body)."""
        with self._open(method, path, body, timeout) as resp:
            raw = resp.read()
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CLIError(f"the daemon answered {method} {path} with something that is not JSON: {raw[:200]!r}") from None

    def ndjson(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Iterator[dict]:
        """Stream JSON lines; an `{"error": ...}` line raises CLIError."""
        with self._open(method, path, body, timeout) as resp:
            for line in resp:
                line = line.strip()
                if not line:
                    continue
                event = json.loads(line)
                if isinstance(event, dict) and "error" in event and "status" not in event:
                    raise CLIError(event["error"] if isinstance(event["error"], str) else json.dumps(event["error"]))
                yield event

    def sse(self, path: str, body: Any, *, timeout: float | None = None) -> Iterator[dict]:
        """Stream server-sent events (`data: {...}` lines) until `data: [DONE]`."""
        with self._open("POST", path, body, timeout) as resp:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                event = json.loads(payload)
                if isinstance(event, dict) and event.get("error"):
                    raise CLIError(_message(payload.encode()) or payload)
                yield event
