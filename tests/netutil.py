"""Small helpers shared by tests that start servers on real sockets."""

from __future__ import annotations

import asyncio

import httpx


async def wait_healthy(base_url: str, *, attempts: int = 300, interval: float = 0.02) -> None:
    """Poll GET /health until it answers 200; raise if it never does."""
    async with httpx.AsyncClient(base_url=base_url, timeout=2) as probe:
        for _ in range(attempts):
            try:
                if (await probe.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(interval)
    raise RuntimeError(f"no server answered at {base_url}/health")
