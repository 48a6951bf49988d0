"""Search HuggingFace and the Ollama library into one hit list.

HuggingFace: `GET {HF_ENDPOINT}/api/models?search=Q&filter=gguf&sort=downloads&direction=-1&limit=N&full=true`.
Ollama has no public JSON search API (ollama/ollama#286, #1070, #8554): its library search is the HTML page
`GET {ollama_search_url}/search?q=Q`, whose result items carry `x-test-*` attributes; we read those. That page is
not a stable API, so a change there shows up as an error for the `ollama` source, never as a failed search.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from html.parser import HTMLParser
from urllib.parse import urlencode

from .errors import RegistryError
from .fetch import Fetcher
from .httpclient import status_error

SOURCES = ("hf", "ollama")
HF_FILTERS = {"gguf": ".gguf", "safetensors": ".safetensors", "any": None}


def hit(source: str, id: str, name: str, *, description=None, downloads=None, last_modified=None, tags=None, files=None) -> dict:
    return {
        "source": source,
        "id": id,  # usable as a pull spec
        "name": name,
        "description": description,
        "downloads": downloads,
        "last_modified": last_modified,
        "tags": tags or [],
        "files": files or [],
    }


async def search_hf(fetcher: Fetcher, query: str, *, limit: int, hf_filter: str = "gguf") -> list[dict]:
    if hf_filter not in HF_FILTERS:
        raise RegistryError("invalid_request", f"hf_filter must be one of {', '.join(HF_FILTERS)}, not '{hf_filter}'")
    params = {"search": query, "sort": "downloads", "direction": "-1", "limit": str(limit), "full": "true"}
    if hf_filter != "any":
        params["filter"] = hf_filter
    resp = await fetcher.http.request("GET", f"{fetcher.hf_endpoint}/api/models?{urlencode(params)}")
    try:
        if resp.status != 200:
            raise status_error(resp, "searching HuggingFace")
        data = await resp.json(content_type=None)
    finally:
        resp.release()
    ext = HF_FILTERS[hf_filter]
    hits = []
    for m in data if isinstance(data, list) else []:
        repo = m.get("id") or m.get("modelId")
        if not repo:
            continue
        files = [s.get("rfilename") for s in m.get("siblings") or [] if s.get("rfilename")]
        if ext:
            files = [f for f in files if f.lower().endswith(ext)]
        card = m.get("cardData") or {}
        hits.append(
            hit("hf", f"hf://{repo}", repo, description=card.get("description") or m.get("pipeline_tag"), downloads=m.get("downloads"),
                last_modified=m.get("lastModified") or m.get("createdAt"), tags=list(m.get("tags") or []), files=sorted(files))  # fmt: skip
        )
    return hits[:limit]


class _OllamaSearchPage(HTMLParser):
    """Collects the items of ollama.com/search: <li x-test-model> with x-test-search-response-title,
    x-test-capability, x-test-size, x-test-pull-count, x-test-updated (its parent's title holds the date)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.items: list[dict] = []
        self._item: dict | None = None
        self._field: str | None = None
        self._text: list[str] = []
        self._title_stack: list[str | None] = []
        self._in_p = False
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "x-test-model" in a:
            self._item = {"name": "", "description": "", "capabilities": [], "sizes": [], "pulls": None, "updated": None, "updated_title": None,
                          "href": None, "tag_count": None}  # fmt: skip
            self.items.append(self._item)
            self._depth = 0
        if self._item is None:
            return
        if tag not in ("br", "img", "path", "meta", "input", "hr"):
            self._depth += 1
            self._title_stack.append(a.get("title"))
        if tag == "a" and a.get("href") and not self._item["href"]:
            self._item["href"] = a["href"]
        for key in ("x-test-search-response-title", "x-test-capability", "x-test-size", "x-test-pull-count", "x-test-updated", "x-test-tag-count"):
            if key in a:
                self._field = key
                self._text = []
                if key == "x-test-updated":
                    titles = [t for t in self._title_stack[:-1] if t]
                    self._item["updated_title"] = titles[-1] if titles else None
        if tag == "p" and not self._item["description"] and self._field is None:
            self._in_p = True
            self._text = []

    def handle_endtag(self, tag):
        if self._item is None:
            return
        if self._field is not None and tag == "span":
            text = " ".join("".join(self._text).split())
            f = self._field
            if f == "x-test-search-response-title":
                self._item["name"] = text
            elif f == "x-test-capability":
                self._item["capabilities"].append(text)
            elif f == "x-test-size":
                self._item["sizes"].append(text)
            elif f == "x-test-pull-count":
                self._item["pulls"] = text
            elif f == "x-test-updated":
                self._item["updated"] = text
            elif f == "x-test-tag-count":
                self._item["tag_count"] = text
            self._field = None
        elif self._in_p and tag == "p":
            self._item["description"] = " ".join("".join(self._text).split())
            self._in_p = False
        if tag not in ("br", "img", "path", "meta", "input", "hr") and self._title_stack:
            self._title_stack.pop()
            self._depth -= 1
            if self._depth <= 0 and tag == "li":
                self._item = None

    def handle_data(self, data):
        if self._field is not None or self._in_p:
            self._text.append(data)


def parse_count(text: str | None) -> int | None:
    """'27.7K' -> 27700, '1.2M' -> 1200000, '812' -> 812."""
    if not text:
        return None
    m = re.match(r"^\s*([\d.,]+)\s*([KMB]?)", text.strip(), re.I)
    if not m:
        return None
    try:
        value = float(m.group(1).replace(",", ""))
    except ValueError:
        return None
    return int(round(value * {"": 1, "K": 1e3, "M": 1e6, "B": 1e9}[m.group(2).upper()]))


def parse_updated(title: str | None, text: str | None) -> str | None:
    """The item's date: its title ('Feb 27, 2025 7:26 PM UTC') as ISO 8601, else the relative text ('3 weeks ago')."""
    if title:
        for fmt in ("%b %d, %Y %I:%M %p UTC", "%b %d, %Y %H:%M UTC", "%b %d, %Y"):
            try:
                return dt.datetime.strptime(title.strip(), fmt).replace(tzinfo=dt.timezone.utc).isoformat()
            except ValueError:
                continue
    return text


async def search_ollama(fetcher: Fetcher, query: str, *, limit: int) -> list[dict]:
    url = f"{fetcher.ollama_search_url}/search?{urlencode({'q': query})}"
    resp = await fetcher.http.request("GET", url, headers={"HX-Request": "true", "Accept": "text/html"})
    try:
        if resp.status != 200:
            raise status_error(resp, "searching the Ollama library")
        page = await resp.text(errors="replace")
    finally:
        resp.release()
    parser = _OllamaSearchPage()
    parser.feed(page)
    hits = []
    for item in parser.items:
        name = item["name"] or (item["href"] or "").rsplit("/", 1)[-1]
        if not name:
            continue
        href = (item["href"] or "").strip("/")
        full = href[len("library/") :] if href.startswith("library/") else (href or name)
        namespace, _, short = full.rpartition("/")
        spec = f"ollama://{full}" if namespace else f"ollama://library/{full}"
        files = [f"{short or name}:{size}" for size in item["sizes"]]
        hits.append(
            hit("ollama", spec, full, description=item["description"] or None, downloads=parse_count(item["pulls"]),
                last_modified=parse_updated(item["updated_title"], item["updated"]), tags=item["capabilities"] + item["sizes"], files=files)  # fmt: skip
        )
        if len(hits) >= limit:
            break
    return hits


async def search(
    fetcher: Fetcher, query: str, *, limit: int = 20, sources: list[str] | tuple[str, ...] = SOURCES, hf_filter: str = "gguf", timeout: float = 10.0
) -> dict:
    """{'hits': [...], 'errors': {source: message}}; hits from every source that answered, most downloaded first."""
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise RegistryError("invalid_request", f"unknown search source(s) {', '.join(unknown)}; use {', '.join(SOURCES)}")
    if hf_filter not in HF_FILTERS:
        raise RegistryError("invalid_request", f"hf_filter must be one of {', '.join(HF_FILTERS)}, not '{hf_filter}'")
    if limit < 1:
        raise RegistryError("invalid_request", "limit must be at least 1")
    calls = {
        "hf": lambda: search_hf(fetcher, query, limit=limit, hf_filter=hf_filter),
        "ollama": lambda: search_ollama(fetcher, query, limit=limit),
    }

    async def one(source):
        try:
            return await asyncio.wait_for(calls[source](), timeout)
        except asyncio.TimeoutError:
            raise RegistryError("timeout", f"{source} did not answer within {timeout:g}s") from None

    results = await asyncio.gather(*(one(s) for s in sources), return_exceptions=True)
    hits: list[dict] = []
    errors: dict[str, str] = {}
    for source, res in zip(sources, results):
        if isinstance(res, RegistryError):
            errors[source] = res.message
        elif isinstance(res, BaseException):
            errors[source] = f"{type(res).__name__}: {res}"
        else:
            hits.extend(res)
    hits.sort(key=lambda h: -(h["downloads"] or 0))
    return {"hits": hits[:limit], "errors": errors}
