"""Local stand-ins for the remotes a pull talks to, on 127.0.0.1, implementing their real routes:

- FileHost: a plain HTTP file server / CDN with Range support, request and byte accounting, and faults
  (ignore Range, drop the connection after N bytes, throttle).
- FakeHF: HuggingFace's /api/models listing and search, /{repo}/resolve/{rev}/{path} answering HEAD and GET
  with a 302 to a FileHost "CDN" carrying X-Linked-ETag / X-Linked-Size / X-Repo-Commit.
- FakeOllama: the v2 registry (manifests, blobs redirecting to a FileHost) and the library's /search page.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Served:
    method: str
    path: str
    headers: dict
    status: int = 0
    bytes_sent: int = 0


@dataclass
class Fault:
    ignore_range: bool = False
    cut_after: int | None = None  # drop the connection after this many body bytes
    cut_times: int = 1  # how many requests get cut
    delay: float = 0.0  # seconds between 16 KiB chunks
    status: int | None = None  # answer with this status instead


async def start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


class FileHost:
    """Serves `files[path] = bytes` at GET/HEAD /<path>, honouring `Range: bytes=N-` (unless faulted)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, Fault] = {}
        self.log: list[Served] = []
        self.url = ""
        self.runner = None
        self.app = web.Application()
        self.app.router.add_route("*", "/{path:.*}", self.handle)

    def add(self, path: str, data: bytes, fault: Fault | None = None) -> str:
        path = path.lstrip("/")
        self.files[path] = data
        if fault:
            self.faults[path] = fault
        return f"{self.url}/{path}"

    def requests(self, path: str, method: str = "GET") -> list[Served]:
        return [s for s in self.log if s.path == path.lstrip("/") and s.method == method]

    async def __aenter__(self):
        self.runner, self.url = await start(self.app)
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        served = Served(request.method, path, dict(request.headers))
        self.log.append(served)
        data = self.files.get(path)
        if data is None:
            served.status = 404
            return web.Response(status=404, text="not found")
        fault = self.faults.get(path) or Fault()
        if fault.status:
            served.status = fault.status
            return web.Response(status=fault.status, text="fault")
        start_at = 0
        status = 200
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        m = re.match(r"bytes=(\d+)-$", request.headers.get("Range", ""))
        if m and not fault.ignore_range:
            start_at = int(m.group(1))
            if start_at >= len(data):
                served.status = 416
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
            status = 206
            headers["Content-Range"] = f"bytes {start_at}-{len(data) - 1}/{len(data)}"
        body = data[start_at:]
        headers["Content-Length"] = str(len(body))
        served.status = status
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        cut = None
        if fault.cut_after is not None and fault.cut_times > 0:
            fault.cut_times -= 1
            cut = fault.cut_after
        step = 16384
        for i in range(0, len(body), step):
            chunk = body[i : i + step]
            if cut is not None and served.bytes_sent + len(chunk) > cut:
                chunk = chunk[: cut - served.bytes_sent]
                if chunk:
                    await resp.write(chunk)
                    served.bytes_sent += len(chunk)
                await asyncio.sleep(0.05)
                request.transport.close()
                return resp
            await resp.write(chunk)
            served.bytes_sent += len(chunk)
            if fault.delay:
                await asyncio.sleep(fault.delay)
        await resp.write_eof()
        return resp


@dataclass
class HFRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    downloads: int = 0
    tags: list = field(default_factory=lambda: ["gguf"])
    last_modified: str = "2025-01-01T00:00:00.000Z"


class FakeHF:
    """HuggingFace's hub routes; files live on `cdn` (a FileHost) under /repos/<sha256>."""

    def __init__(self, cdn: FileHost, *, token: str | None = None, linked_etag: bool = True):
        self.cdn = cdn
        self.repos: dict[str, HFRepo] = {}
        self.token = token  # when set, resolve/api answer 401 without it
        self.linked_etag = linked_etag
        self.log: list[Served] = []
        self.url = ""
        self.app = web.Application()
        self.app.router.add_get("/api/models", self.search)
        self.app.router.add_get("/api/models/{org}/{repo}", self.info)
        self.app.router.add_get("/api/models/{org}/{repo}/revision/{rev}", self.info)
        self.app.router.add_route("*", "/{org}/{repo}/resolve/{rev}/{path:.*}", self.resolve)

    def add_repo(self, repo_id: str, files: dict[str, bytes], **kw) -> HFRepo:
        repo = HFRepo(files, **kw)
        self.repos[repo_id] = repo
        for data in files.values():
            self.cdn.add(f"repos/{hashlib.sha256(data).hexdigest()}", data)
        return repo

    def cdn_path(self, data: bytes) -> str:
        return f"repos/{hashlib.sha256(data).hexdigest()}"

    async def __aenter__(self):
        self.runner, self.url = await start(self.app)
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    def _record(self, request) -> Served:
        s = Served(request.method, request.path, dict(request.headers))
        self.log.append(s)
        return s

    def _authorized(self, request) -> bool:
        return self.token is None or request.headers.get("Authorization") == f"Bearer {self.token}"

    async def info(self, request):
        self._record(request)
        repo_id = f"{request.match_info['org']}/{request.match_info['repo']}"
        repo = self.repos.get(repo_id)
        if not self._authorized(request):
            return web.json_response({"error": "Invalid credentials"}, status=401)
        if repo is None:
            return web.json_response({"error": "Repository not found"}, status=404)
        return web.json_response({"id": repo_id, "sha": repo.commit, "siblings": [{"rfilename": f} for f in sorted(repo.files)]})

    async def search(self, request):
        self._record(request)
        q = request.query.get("search", "").lower()
        flt = request.query.get("filter")
        limit = int(request.query.get("limit", "20"))
        out = []
        for repo_id, repo in sorted(self.repos.items(), key=lambda kv: -kv[1].downloads):
            if q not in repo_id.lower() or (flt and flt not in repo.tags):
                continue
            item = {"id": repo_id, "modelId": repo_id, "downloads": repo.downloads, "tags": repo.tags, "lastModified": repo.last_modified}
            if request.query.get("full") == "true":
                item["siblings"] = [{"rfilename": f} for f in sorted(repo.files)]
            out.append(item)
        return web.json_response(out[:limit])

    async def resolve(self, request):
        s = self._record(request)
        if not self._authorized(request):
            s.status = 401
            return web.Response(status=401)
        repo = self.repos.get(f"{request.match_info['org']}/{request.match_info['repo']}")
        data = repo.files.get(request.match_info["path"]) if repo else None
        if data is None:
            s.status = 404
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        sha = hashlib.sha256(data).hexdigest()
        headers = {"Location": f"{self.cdn.url}/{self.cdn_path(data)}", "X-Repo-Commit": repo.commit, "ETag": f'"{sha[:40]}"'}
        if self.linked_etag:
            headers["X-Linked-ETag"] = f'"{sha}"'
            headers["X-Linked-Size"] = str(len(data))
        s.status = 302
        return web.Response(status=302, headers=headers)


class FakeOllama:
    """The Ollama v2 registry (manifests + blobs redirecting to `cdn`) and the library search page."""

    def __init__(self, cdn: FileHost):
        self.cdn = cdn
        self.manifests: dict[str, dict] = {}
        self.blobs: dict[str, bytes] = {}
        self.search_html = ""
        self.log: list[Served] = []
        self.url = ""
        self.app = web.Application()
        self.app.router.add_get("/v2/{ns}/{name}/manifests/{tag}", self.manifest)
        self.app.router.add_get("/v2/{ns}/{name}/blobs/{digest}", self.blob)
        self.app.router.add_get("/search", self.search)

    def add_model(self, ref: str, model: bytes, *, params: dict | None = None, template: str | None = None, model_digest: str | None = None) -> dict:
        layers = []

        def layer(media, data, digest=None):
            d = digest or "sha256:" + hashlib.sha256(data).hexdigest()
            self.blobs[d] = data
            self.cdn.add(f"ollama-blobs/{d}", data)
            layers.append({"mediaType": media, "digest": d, "size": len(data)})

        layer("application/vnd.ollama.image.model", model, model_digest)
        if template is not None:
            layer("application/vnd.ollama.image.template", template.encode())
        if params is not None:
            layer("application/vnd.ollama.image.params", json.dumps(params).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64, "size": 2},
                    "layers": layers}  # fmt: skip
        self.manifests[ref] = manifest
        return manifest

    async def __aenter__(self):
        self.runner, self.url = await start(self.app)
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    async def manifest(self, request):
        s = Served(request.method, request.path, dict(request.headers))
        self.log.append(s)
        ref = f"{request.match_info['ns']}/{request.match_info['name']}:{request.match_info['tag']}"
        m = self.manifests.get(ref)
        if m is None:
            return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}, status=404)
        return web.Response(body=json.dumps(m).encode(), content_type="application/vnd.docker.distribution.manifest.v2+json")

    async def blob(self, request):
        s = Served(request.method, request.path, dict(request.headers))
        self.log.append(s)
        d = request.match_info["digest"]
        if d not in self.blobs:
            return web.json_response({"errors": [{"code": "BLOB_UNKNOWN"}]}, status=404)
        return web.Response(status=307, headers={"Location": f"{self.cdn.url}/ollama-blobs/{d}"})

    async def search(self, request):
        self.log.append(Served(request.method, request.path_qs, dict(request.headers)))
        return web.Response(text=self.search_html, content_type="text/html")


OLLAMA_SEARCH_PAGE = """<ul role="list">
<li x-test-model class="flex items-baseline border-b border-neutral-200 py-6">
  <a href="/library/granite3.2-vision" class="group w-full">
    <div class="flex flex-col mb-1" title="granite3.2-vision">
      <h2 class="truncate text-xl"><span x-test-search-response-title>granite3.2-vision</span></h2>
      <p class="max-w-lg break-words text-neutral-800 text-md">A compact and efficient vision-language model &amp; more.</p>
    </div>
    <div class="flex flex-col">
      <div class="flex flex-wrap space-x-2">
        <span x-test-capability class="inline-flex">vision</span>
        <span x-test-capability class="inline-flex">tools</span>
        <span x-test-size class="inline-flex">2b</span>
      </div>
      <p class="my-1 flex space-x-5 text-[13px]">
        <span class="flex items-center"><svg viewBox="0 0 24 24"><path d="M3 16.5v2.25"></path></svg>
          <span x-test-pull-count>27.7K</span><span class="hidden sm:flex">&nbsp;Pulls</span></span>
        <span class="flex items-center"><span x-test-tag-count>5</span><span class="hidden sm:flex">&nbsp;Tags</span></span>
        <span class="flex items-center" title="Feb 27, 2025 7:26 PM UTC"><svg viewBox="0 0 24 24"><path d="M12 6v6h4.5"></path></svg>
          <span class="hidden sm:flex">Updated&nbsp;</span><span x-test-updated>3 weeks ago</span></span>
      </p>
    </div>
  </a>
</li>
<li x-test-model class="flex items-baseline border-b border-neutral-200 py-6">
  <a href="/library/qwen3" class="group w-full">
    <div class="flex flex-col mb-1" title="qwen3">
      <h2><span x-test-search-response-title>qwen3</span></h2>
      <p class="max-w-lg">Qwen3 is the latest generation of large language models in Qwen series.</p>
    </div>
    <div class="flex flex-col"><div class="flex flex-wrap space-x-2">
      <span x-test-capability>tools</span><span x-test-capability>thinking</span>
      <span x-test-size>0.6b</span><span x-test-size>8b</span></div>
      <p class="my-1"><span class="flex items-center"><span x-test-pull-count>3.1M</span></span>
      <span class="flex items-center" title="May 1, 2025 10:00 AM UTC"><span x-test-updated>2 months ago</span></span></p>
    </div>
  </a>
</li>
</ul>"""
