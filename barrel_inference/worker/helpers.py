"""Helper calls whose cost grows with their input (rendering and counting a whole prompt: a coding
agent's count_tokens carries tens of thousands of tokens of system text and tool schemas) run on a
thread of their own, never on the scheduler thread, so a count never delays a running stream's next
token. Replies go back through the server's inproc replies socket, which the scheduler thread
forwards between ticks, as it does for embeddings.

Tokenizing reads only the model's vocabulary, and a Jinja template renders from any thread: both
are safe next to the scheduler thread's decode.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import zmq


class HelperThread:
    def __init__(self, server: Any, answer: Callable[[Any], Any], name: str = "helpers") -> None:
        self.server = server
        self.answer = answer  # msg -> reply (never raises for a bad request: it returns a reply with an error)
        self.name = name
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, peer: bytes, msg: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((peer, msg))

    def stop(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(5)

    def _run(self) -> None:
        server = self.server
        push = server.zctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(server._replies_endpoint)
        try:
            while (job := self._jobs.get()) is not None:
                peer, msg = job
                try:
                    reply = self.answer(msg)
                except Exception as exc:  # noqa: BLE001 - a bug fails this call, not the thread
                    server.log("helper_error", call=type(msg).__name__, error=repr(exc))
                    reply = server.internal_reply(msg, f"internal error in {type(msg).__name__}: {exc!r}")
                push.send_multipart([peer, server.codec.encode(reply)])
        finally:
            push.close(0)
