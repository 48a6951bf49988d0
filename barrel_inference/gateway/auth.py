"""API keys for every family (Settings.api_keys, plus anthropic_api_keys as Anthropic-only keys).

An ASGI middleware in front of the routes. It reads the settings on each request, so a config reload
(SIGHUP) adds or revokes keys without a restart. A family is protected when a configured key names it
(or a key names no family); then a request without a key known for that family gets 401 in the
family's own envelope. Management routes (pull, delete, create, copy, edit, push, unload, alias set / rm) need a key
marked admin once any key is configured (403 for a known key that is not admin). /health stays open;
/metrics needs a key only with metrics_require_key. Keys are compared in constant time, every key
every time.

A key may be limited to some models (`models`: names, aliases or fnmatch patterns). The middleware
puts the key a request presented in its scope; the routes that run a model check it with
`permit_model` once the model's name is known (the request body is read by then): another model is
a 403 in the family's envelope (Anthropic: permission_error).
"""

from __future__ import annotations

import fnmatch
import hmac
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ..protocol import ErrorCode, ErrorInfo
from .errors import GatewayError
from .family import Families

OPEN_PATHS = ("/health",)
MANAGEMENT_PATHS = ("/api/pull", "/api/delete", "/api/create", "/api/copy", "/api/edit", "/api/push", "/api/unload")
# PUT / DELETE under it change the daemon's aliases (`bictl alias set / rm`): management too
ALIAS_PATH = "/api/aliases/"
# how each family's clients send a key
X_API_KEY_FAMILIES = ("anthropic",)
SCOPE_KEY = "barrel_inference.api_key"  # the key a request presented (set by the middleware)


def allows_model(key: Any, *names: str) -> bool:
    """May `key` use a model known by any of `names` (the name asked for, its registry name)?"""
    patterns = getattr(key, "models", None)
    if not patterns:
        return True
    for name in names:
        for pattern in patterns:
            if fnmatch.fnmatchcase(name, pattern) or (":" not in pattern and fnmatch.fnmatchcase(name, pattern + ":latest")):
                return True
    return False


async def permit_model(scope: Scope, state: Any, name: str) -> None:
    """Raise a 403 GatewayError when the request's key may not use model `name` (an alias or a registry
    name: both are checked against the key's `models`). Unknown models raise their usual 404."""
    key = scope.get(SCOPE_KEY)
    if key is None or not key.models:
        return
    resolved = (await state.models.resolve(name)).name if not allows_model(key, name) else name
    if not allows_model(key, name, resolved):
        raise GatewayError(ErrorCode.FORBIDDEN, f"this API key may not use model {name!r}", param="model")


def presented_key(headers: dict[bytes, bytes], family: str) -> str | None:
    if family in X_API_KEY_FAMILIES:
        key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
        if key:
            return key
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def find_key(given: str | None, keys: list) -> Any:
    """The configured key equal to `given` (every key compared, in constant time), or None."""
    found = None
    raw = (given or "").encode()
    for k in keys:
        if hmac.compare_digest(raw, k.key.encode()) and given is not None:
            found = k
    return found


def _covers(key: Any, family: str) -> bool:
    return not key.families or family in key.families


def route_family(families: Families, path: str, headers: dict[bytes, bytes]) -> str:
    if path in ("/v1/models",) or path.startswith("/v1/models/"):
        if b"anthropic-version" in headers:  # Anthropic's model listing shares the path
            return "anthropic"
    return families.for_path(path).name


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, settings: Any, families: Families) -> None:
        self.app = app
        self.settings = settings
        self.families = families

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        keys = self.settings.all_api_keys()
        path = scope.get("path", "")
        if not keys or path in OPEN_PATHS or (path == "/metrics" and not self.settings.metrics_require_key):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        family = route_family(self.families, path, headers)
        management = path in MANAGEMENT_PATHS or (path.startswith(ALIAS_PATH) and scope.get("method") != "GET")
        protected = management or path == "/metrics" or any(_covers(k, family) for k in keys)
        if not protected:
            return await self.app(scope, receive, send)
        key = find_key(presented_key(headers, family), keys)
        if key is None or not (_covers(key, family) or path == "/metrics"):
            info = ErrorInfo(ErrorCode.UNAUTHENTICATED, "a valid API key is required: send it as Authorization: Bearer <key>"
                             + (" or x-api-key" if family in X_API_KEY_FAMILIES else ""))  # fmt: skip
            return await self._deny(scope, receive, send, path, info, 401)
        if management and not key.admin:
            info = ErrorInfo(ErrorCode.FORBIDDEN, f"{path} changes the server's models: it needs an API key marked admin")
            return await self._deny(scope, receive, send, path, info, 403)
        scope[SCOPE_KEY] = key  # the routes check its model permissions (permit_model)
        return await self.app(scope, receive, send)

    async def _deny(self, scope: Scope, receive: Receive, send: Send, path: str, info: ErrorInfo, status: int) -> None:
        headers = dict(scope.get("headers") or [])
        if route_family(self.families, path, headers) == "anthropic":
            fam = next((f for f in self.families.all if f.name == "anthropic"), None)
            if fam is not None:
                return await fam.error_response(info, status=status)(scope, receive, send)
        await self.families.error_response(path, info, status=status)(scope, receive, send)
