"""Resumable download of one file into `tmp/<key>.part` under a running sha256.

An existing part is resumed with `Range: bytes=N-` after re-reading it once to seed the hash; a server that
answers 200 instead of 206 (or a Content-Range that does not start at N) restarts the part from zero. A connection
that drops mid-body is resumed a few times. A sha256 mismatch deletes the part. The caller moves the verified
part into the blob store."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import aiohttp

from .errors import RegistryError
from .httpclient import HTTPClient, status_error

CHUNK = 1 << 16  # read size
WRITE_AT = 1 << 18  # buffered bytes handed to a thread for write + hash
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")

Progress = Callable[[int, int | None], None]


class _WrongMagic(Exception):
    pass


def _seed(part: Path) -> tuple["hashlib._Hash", int]:
    h = hashlib.sha256()
    n = 0
    with open(part, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
            n += len(block)
    return h, n


def _write(f, h, data: bytes) -> None:
    f.write(data)
    h.update(data)


async def download(
    client: HTTPClient,
    url: str,
    part: Path,
    *,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    progress: Progress | None = None,
    retries: int = 3,
    what: str = "download",
    magic: bytes | None = None,
) -> tuple[str, int]:
    """Download `url` into `part` (resuming what is there); return (sha256 hex, size). Raises RegistryError.

    With `magic`, a download from the start is stopped as soon as its first bytes differ (not_gguf):
    a large file of the wrong kind is never fetched in full."""
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if expected_size is not None and have > expected_size:
        part.unlink()
        have = 0
    if have:
        h, have = await asyncio.to_thread(_seed, part)
    else:
        h = hashlib.sha256()
    total = expected_size
    failures = 0
    range_refused = False
    while not (expected_size is not None and have == expected_size and have > 0):
        headers = {"Accept-Encoding": "identity"}
        if have and not range_refused:
            headers["Range"] = f"bytes={have}-"
        resp = await client.request("GET", url, headers=headers)
        try:
            if resp.status == 416 and have:
                # our part is not a prefix the server can continue (e.g. the file changed): start over
                resp.release()
                part.unlink(missing_ok=True)
                have, h = 0, hashlib.sha256()
                range_refused = True
                continue
            if resp.status == 206 and "Range" in headers:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if not m or int(m.group(1)) != have:
                    resp.release()
                    range_refused = True
                    part.unlink(missing_ok=True)
                    have, h = 0, hashlib.sha256()
                    continue
                if m.group(3) != "*":
                    total = int(m.group(3))
                mode = "ab"
            elif resp.status == 200:
                if have:  # the server ignored the range: restart cleanly
                    have, h = 0, hashlib.sha256()
                mode = "wb"
                if resp.content_length is not None:
                    total = resp.content_length
            else:
                raise status_error(resp, what)
            if expected_size is not None:
                total = expected_size
            if progress:
                progress(have, total)
            dropped: BaseException | None = None
            check_magic = magic if have == 0 else None
            wrong_kind = False
            with open(part, mode) as f:
                buf = bytearray()
                try:
                    async for chunk in resp.content.iter_chunked(CHUNK):
                        buf += chunk
                        if check_magic is not None and len(buf) >= len(check_magic):
                            if bytes(buf[: len(check_magic)]) != check_magic:
                                buf.clear()
                                raise _WrongMagic()
                            check_magic = None
                        if len(buf) >= WRITE_AT:
                            await asyncio.to_thread(_write, f, h, bytes(buf))
                            have += len(buf)
                            buf.clear()
                        if progress:
                            progress(have + len(buf), total)
                except _WrongMagic:
                    wrong_kind = True
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                    dropped = exc  # what arrived before the drop is a valid prefix: keep it
                finally:
                    # also on cancellation: keep every byte that arrived, so that the next pull resumes after it
                    if buf:
                        _write(f, h, bytes(buf))
                        have += len(buf)
                    f.flush()
                    os.fsync(f.fileno())
            if wrong_kind:  # stopped after its first bytes; nothing of it is kept or echoed
                part.unlink(missing_ok=True)
                raise RegistryError("not_gguf", f"{what}: the file is not a GGUF file; the download was stopped", url=url)
            if dropped is not None:
                failures += 1
                if failures > retries:
                    raise RegistryError(
                        "network", f"{what}: the connection kept dropping ({dropped}); run the pull again to resume", url=url
                    ) from dropped
                continue
            if progress:
                progress(have, total)
        finally:
            resp.release()
        if total is not None and have < total:
            failures += 1
            if failures > retries:
                raise RegistryError("network", f"{what}: the server sent {have} of {total} bytes; run the pull again to resume", url=url)
            continue
        break
    digest = h.hexdigest()
    if expected_size is not None and have != expected_size:
        part.unlink(missing_ok=True)
        raise RegistryError("size_mismatch", f"{what}: got {have} bytes, expected {expected_size}", got=have, want=expected_size)
    if expected_sha256 and digest != expected_sha256.lower():
        part.unlink(missing_ok=True)
        raise RegistryError(
            "sha256_mismatch",
            f"{what}: the file's sha256 is {digest} but {expected_sha256.lower()} was expected; the download was discarded",
            got=digest,
            want=expected_sha256.lower(),
        )
    return digest, have
