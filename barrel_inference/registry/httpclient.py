"""aiohttp with our redirect policy: redirects are followed by hand so that a bearer token is sent only to the
origin it belongs to (HF_TOKEN goes to the HF host, never to the CDN it redirects to)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.request
from urllib.parse import urljoin, urlsplit

import aiohttp

from .errors import RegistryError

REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "barrel-inference/0.1 (+model fetch)"


def origin(url: str) -> tuple[str, str, int]:
    p = urlsplit(url)
    scheme = p.scheme.lower()
    return scheme, (p.hostname or "").lower(), p.port or (443 if scheme == "https" else 80)


class ForbiddenAddress(OSError):
    """A host that resolves to an address pulls may not reach (loopback, private, link-local...)."""


def address_allowed(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class AddressGuard:
    """Which hosts a fetch may reach: public addresses only, except the trusted hosts (the configured
    registries, the proxies) or everything when `allow_private`. Names are checked where they are
    resolved for the connection (no second lookup a rebinding DNS could answer differently)."""

    def __init__(self, trusted_hosts=(), allow_private: bool = False) -> None:
        self.allow_private = allow_private
        hosts = {h.lower() for h in trusted_hosts if h}
        for proxy in urllib.request.getproxies().values():
            host = urlsplit(proxy if "://" in proxy else "http://" + proxy).hostname
            if host:
                hosts.add(host.lower())
        self.trusted = hosts

    def skip(self, host: str) -> bool:
        return self.allow_private or host.lower().strip("[]") in self.trusted

    def check_literal(self, url: str) -> None:
        host = (urlsplit(url).hostname or "").lower()
        if self.skip(host):
            return
        try:
            ok = address_allowed(host)
        except ValueError:
            return  # a name: checked by the resolver
        if not ok:
            raise RegistryError("forbidden_address", f"pulls from {host} are not allowed: it is a loopback, private or link-local address "
                                "(set pull_allow_private = true to allow them)", url=url)  # fmt: skip


class GuardedResolver(aiohttp.ThreadedResolver):
    def __init__(self, guard: AddressGuard) -> None:
        super().__init__()
        self.guard = guard

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        results = await super().resolve(host, port, family)
        if not self.guard.skip(host):
            for r in results:
                if not address_allowed(r["host"]):
                    raise ForbiddenAddress(f"{host} resolves to {r['host']}, a loopback, private or link-local address")
        return results


class HTTPClient:
    """One aiohttp session; `token` is sent as `Authorization: Bearer` to `token_origin` only."""

    def __init__(self, *, token: str | None = None, token_origin: str | None = None, connect_timeout: float = 30, read_timeout: float = 60,
                 guard: AddressGuard | None = None):  # fmt: skip
        self.token = token
        self.token_origin = origin(token_origin) if token_origin else None
        self.guard = guard
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(resolver=GuardedResolver(self.guard)) if self.guard is not None else None
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers={"User-Agent": USER_AGENT}, trust_env=True, connector=connector)
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
            if self.guard is not None:
                self.guard.check_literal(url)  # every hop: a redirect to 127.0.0.1 is refused too
            try:
                resp = await self.session.request(method, url, headers=self._headers(url, headers), allow_redirects=False)
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, ForbiddenAddress) or isinstance(exc.__cause__, ForbiddenAddress):
                    raise RegistryError("forbidden_address", f"pulls from {urlsplit(url).hostname} are not allowed: {exc.os_error} "
                                        "(set pull_allow_private = true to allow them)", url=url) from exc  # fmt: skip
                raise RegistryError("network", f"could not reach {urlsplit(url).netloc}: {exc}", url=url) from exc
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
