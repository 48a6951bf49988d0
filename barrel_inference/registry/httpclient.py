"""aiohttp with our redirect policy: redirects are followed by hand so that a bearer token is sent only to the
origin it belongs to (HF_TOKEN goes to the HF host, never to the CDN it redirects to)."""

from __future__ import annotations

import asyncio
from urllib.parse import urljoin, urlsplit

import aiohttp

from .errors import RegistryError

REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "barrel-inference/0.1 (+model fetch)"


def origin(url: str) -> tuple[str, str, int]:
    p = urlsplit(url)
    scheme = p.scheme.lower()
    return scheme, (p.hostname or "").lower(), p.port or (443 if scheme == "https" else 80)


class HTTPClient:
    """One aiohttp session; `token` is sent as `Authorization: Bearer` to `token_origin` only."""

    def __init__(self, *, token: str | None = None, token_origin: str | None = None, connect_timeout: float = 30, read_timeout: float = 60):
        self.token = token
        self.token_origin = origin(token_origin) if token_origin else None
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers={"User-Agent": USER_AGENT}, trust_env=True)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, url: str, headers: dict | None) -> dict:
        out = dict(headers or {})
        if self.token and self.token_origin and origin(url) == self.token_origin:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    async def request(
        self, method: str, url: str, *, headers: dict | None = None, follow: bool = True, same_origin_only: bool = False, max_redirects: int = 10
    ) -> aiohttp.ClientResponse:
        """Send a request, following redirects ourselves (token only to its origin). The caller releases the
        response. `same_origin_only` stops at the first redirect to another origin (for HEAD probes)."""
        for _ in range(max_redirects + 1):
            try:
                resp = await self.session.request(method, url, headers=self._headers(url, headers), allow_redirects=False)
            except asyncio.TimeoutError as exc:
                raise RegistryError("timeout", f"{urlsplit(url).netloc} did not answer in time", url=url) from exc
            except aiohttp.ClientError as exc:
                raise RegistryError("network", f"could not reach {urlsplit(url).netloc}: {exc}", url=url) from exc
            location = resp.headers.get("Location")
            if not follow or resp.status not in REDIRECTS or not location:
                return resp
            target = urljoin(url, location)
            if same_origin_only and origin(target) != origin(url):
                return resp
            resp.release()
            if resp.status == 303:
                method = "GET" if method != "HEAD" else method
            url = target
        raise RegistryError("http_status", f"too many redirects fetching {url}", status=310, url=url)


def status_error(resp: aiohttp.ClientResponse, what: str) -> RegistryError:
    url = str(resp.url)
    reason = {401: "authentication required (set HF_TOKEN for gated or private HuggingFace repos)", 403: "access denied", 404: "not found"}.get(
        resp.status, resp.reason or "error"
    )
    return RegistryError("http_status", f"{what}: HTTP {resp.status} {reason} ({url})", status=resp.status, url=url)
