"""The worker's link end: a ZeroMQ ROUTER that gateways connect to.

The scheduler thread owns the ROUTER: before each tick it reads what arrived (without blocking
while there is work, blocking briefly when idle), and it sends each tick's output itself. One
thread, no hand-over between threads and no GIL ping-pong on the token path. Calls (tokenize,
render, stats) are answered between ticks. The main thread only waits for a stop signal.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgspec
import zmq

from ..protocol import (
    PROTOCOL_VERSION, Abort, Call, CallResult, Connect, EndSession, EngineInfo, ErrorCode, ErrorInfo, Hello, Ping, Pong,
    Submit, Tick, WorkerCodec,
)  # fmt: skip
from ..protocol.curve import check_server_keys, secure_server
from .engine_api import Engine, EngineError
from .prompt import PromptBuilder, PromptError
from .request import Request
from .scheduler import Scheduler, error_done
from .templates import ChatTemplate, TemplateError

IDLE_POLL_MS = 200


class WorkerServer:
    def __init__(self, engine: Engine, template: ChatTemplate, *, model: str, bind: str,
                 n_ctx: int, prefill_chunk: int = 256, log=None, engine_info: EngineInfo | None = None,
                 curve: tuple[str, str] | None = None, insecure: bool = False):  # fmt: skip
        if bind.startswith("tcp://") and curve is None and not insecure:
            raise ValueError(
                f"refusing to serve {bind} without CURVE keys: anyone who reaches the port could drive the model; "
                "give --curve-secret-key and --curve-clients (bictl worker keygen), or --insecure"
            )
        if curve is not None:
            check_server_keys(*curve)
        self.curve = curve  # (this worker's secret key file, directory of authorized gateway public keys)
        self.insecure = insecure
        self.engine = engine
        self.engine_info = engine_info
        self.template = template
        self.model = model
        self.bind = bind
        self.n_ctx = n_ctx
        self.log = log or (lambda *a, **k: None)
        self.codec = WorkerCodec()
        self.zctx = zmq.Context.instance()
        self.prompts = PromptBuilder(engine, template, n_ctx, model)
        self.scheduler = Scheduler(engine, self._emit, n_ctx=n_ctx, prefill_chunk=prefill_chunk, log=self.log)
        self._stop = threading.Event()
        self._router: zmq.Socket | None = None
        self.watch_parent: int | None = None  # exit when this process (the spawning gateway) is gone

    # ---- the scheduler thread's I/O -------------------------------------------------------
    def _emit(self, peer: bytes, tick: Tick) -> None:
        try:
            self._router.send_multipart([peer, self.codec.encode(tick)], zmq.NOBLOCK)
        except zmq.Again:  # the peer's queue is full (gateway gone or stuck): its requests time out there
            self.log("send_dropped", peer=peer.hex())

    def _pump(self, block: bool) -> None:
        router = self._router
        if block and not router.poll(IDLE_POLL_MS):
            self._check_parent()
            return
        while True:
            try:
                peer, body = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue  # a peer sent an unexpected frame count
            reply = self.handle(peer, body)
            if reply is not None:
                router.send_multipart([peer, self.codec.encode(reply)])
        self._check_parent()

    def _check_parent(self) -> None:
        if self.watch_parent is not None and os.getppid() != self.watch_parent:
            self.log("parent_gone", parent=self.watch_parent)
            self.stop()

    def _loop(self) -> None:
        router = self.zctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        auth = None
        if self.curve is not None:
            auth = secure_server(self.zctx, router, *self.curve)
        elif self.bind.startswith("tcp://"):
            self.log("insecure_link", bind=self.bind, level="warning",
                     warning="plain tcp without CURVE keys: anyone who reaches this port can use the model")  # fmt: skip
        router.bind(self.bind)
        self._router = router
        self.log("worker_ready", bind=self.bind, model=self.model, pid=os.getpid(), curve=self.curve is not None)
        try:
            self.scheduler.run(self._pump)  # returns after stop(), having aborted what was in flight
        finally:
            router.close(0)
            if auth is not None:
                auth.stop()
            self._stop.set()

    def hello(self) -> Hello:
        e = self.engine
        return Hello(
            protocol_version=PROTOCOL_VERSION,
            model=self.model,
            architecture=e.architecture,
            n_ctx=self.n_ctx,
            n_ctx_train=e.n_ctx_train,
            n_seq_max=e.n_seq_max,
            n_vocab=e.n_vocab,
            chat_template=self.template.name,
            chat_template_source=self.template.source,
            bos_token=self.template.bos_token,
            eos_token=self.template.eos_token,
            pid=os.getpid(),
            engine_info=self.engine_info,
        )

    def _engine_stats(self) -> dict:
        info = self.engine_info
        if info is None:
            return {}
        return {"engine_profile": info.profile, "extra_buffers": info.extra_buffers, "weight_buffers": info.weight_buffers}

    def stop(self) -> None:
        self._stop.set()
        self.scheduler.request_stop()

    def serve(self) -> None:
        if self.bind.startswith("ipc://"):
            path = Path(self.bind[len("ipc://") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        thread.start()
        try:
            while not self._stop.wait(0.5):  # the main thread only takes signals
                pass
        finally:
            self.scheduler.request_stop()
            thread.join(10)
            if self.bind.startswith("ipc://"):
                Path(self.bind[len("ipc://") :]).unlink(missing_ok=True)

    def handle(self, peer: bytes, body: bytes):
        try:
            msg = self.codec.decode(body)
        except msgspec.DecodeError as exc:
            self.log("bad_message", error=str(exc))
            return None
        if isinstance(msg, Submit):
            return self._submit(peer, msg)
        if isinstance(msg, Abort):
            self.scheduler.abort(msg.ids)
            return None
        if isinstance(msg, Call):
            return self._call(msg)
        if isinstance(msg, Ping):
            return Pong(msg.nonce, self.scheduler.n_running, self.scheduler.n_waiting)
        if isinstance(msg, Connect):
            return self.hello()
        if isinstance(msg, EndSession):
            self.scheduler.end_session(msg.session)
        return None

    def _submit(self, peer: bytes, msg: Submit):
        if msg.max_tokens is not None and msg.max_tokens < 1:
            return Tick(done=[error_done(msg.id, ErrorCode.INVALID_REQUEST, "max_tokens must be at least 1", "max_tokens")])
        try:
            tokens = self.prompts.tokens(msg)
            grammar = self.prompts.grammar(msg)
        except PromptError as exc:
            return Tick(done=[error_done(msg.id, exc.code, str(exc), exc.param)])
        req = Request(
            msg.id, peer, tokens, sampling=msg.sampling, grammar=grammar, max_tokens=msg.max_tokens,
            session=msg.session, stop=msg.stop, ignore_eos=msg.ignore_eos, want_tokens=msg.want_tokens,
            piece=self.engine.piece,
        )  # fmt: skip
        self.scheduler.submit(req)
        return None

    def _call(self, msg: Call) -> CallResult:
        e = self.engine
        try:
            if msg.op == "tokenize":
                return CallResult(msg.id, tokens=e.tokenize(msg.text or "", msg.add_special, msg.parse_special))
            if msg.op == "detokenize":
                return CallResult(msg.id, text=e.detokenize(msg.tokens or []))
            if msg.op == "render":
                return CallResult(msg.id, text=self.prompts.render(msg.messages or [], msg.tools, msg.add_generation_prompt))
            if msg.op == "count_tokens":
                if msg.messages is not None:
                    text = self.prompts.render(msg.messages, msg.tools, msg.add_generation_prompt)
                    return CallResult(msg.id, count=len(self.prompts.tokenize_rendered(text)))
                return CallResult(msg.id, count=len(e.tokenize(msg.text or "", msg.add_special, msg.parse_special)))
            if msg.op == "embed":
                vectors, count = e.embed(msg.texts if msg.texts is not None else [msg.text or ""])
                return CallResult(msg.id, embeddings=vectors, count=count)
            if msg.op == "stats":
                return CallResult(msg.id, stats={"model": self.model, "pid": os.getpid(), **self._engine_stats(), **self.scheduler.stats()})
        except (PromptError, TemplateError) as exc:
            return CallResult(msg.id, error=ErrorInfo(ErrorCode.TEMPLATE, str(exc)))
        except EngineError as exc:
            return CallResult(msg.id, error=ErrorInfo(ErrorCode(exc.code), str(exc), param="input"))
        return CallResult(msg.id, error=ErrorInfo(ErrorCode.UNSUPPORTED, f"unknown call op {msg.op!r}", param="op"))
