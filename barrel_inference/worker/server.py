"""The worker's link end: a ZeroMQ ROUTER that gateways connect to.

The scheduler thread owns the ROUTER: before each tick it reads what arrived (without blocking
while there is work, blocking briefly when idle), and it sends each tick's output itself. One
thread, no hand-over between threads and no GIL ping-pong on the token path. Calls (tokenize,
stats) are answered between ticks. Embeddings run on a thread of their own (the engine
gives them their own context): the scheduler thread only hands an Embed over and, later, forwards
its reply, so embedding never holds up a tick. The main thread only waits for a stop signal.

Nothing else whose cost grows with the input runs on the scheduler thread either: a Submit's
rendering, tokenising and grammar (bounded, converted and compiled into its sampler) are prepared
on a preparation thread, and so are the Tokenize, Render and CountTokens calls. Their results come
back through an outbox the scheduler thread sends from (a pipe wakes it). An Abort reaches work
still being prepared: such a request ends with Done(abort) instead of being scheduled.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import zmq

from ..protocol import (
    PROTOCOL_VERSION, Abort, Connect, CountResult, CountTokens, Detokenize, DetokenizeResult, Done, Embed, EmbedResult,
    EndSession, EngineInfo, ErrorCode, ErrorInfo, FinishReason, GetStats, Hello, Ping, Pong, Render, RenderResult, StatsResult,
    Submit, Tick, Tokenize, TokenizeResult, WorkerCodec,
)  # fmt: skip
from ..protocol.curve import check_server_keys, secure_server
from .engine_api import Engine, EngineError
from .kvreuse import KvReuse
from .kvstore import KvStore
from .prompt import PromptBuilder, PromptError
from .request import Request
from .kvselftest import relays, restore_limit
from .scheduler import Scheduler, error_done
from .templates import ChatTemplate, TemplateError
from .toolhook import PlanError, template_switches

MAX_TOP_LOGPROBS = 20
IDLE_POLL_MS = 200


class WorkerServer:
    def __init__(self, engine: Engine, template: ChatTemplate, *, model: str, bind: str,
                 n_ctx: int, prefill_chunk: int = 512, log=None, tools=None, engine_info: EngineInfo | None = None,
                 curve: tuple[str, str] | None = None, insecure: bool = False,
                 content_special: bool = False, prep_threads: int = 2,
                 max_retained_tokens: int | None = None, kv_ram_bytes: int = 0, kv_disk_bytes: int = 0,
                 tail_grace_ms: float = 0.0, kv_restore: str = "exact",
                 kv_dir: str | None = None):  # fmt: skip
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
        self.prompts = PromptBuilder(engine, template, n_ctx, model, content_special=content_special)
        self.tools = tools  # toolhook.ModelTools: tool calls and thinking; None: plain text
        self._prep = ThreadPoolExecutor(max(1, prep_threads), thread_name_prefix="prepare")
        self._lock = threading.Lock()
        self._pending: set[tuple[bytes, str]] = set()  # (peer, id) being prepared off the scheduler thread
        self._cancelled: set[tuple[bytes, str]] = set()
        self._outbox: deque[tuple[bytes, object]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.kv_selftest: dict | None = None
        self.store: KvStore | None = None
        restore_up_to = restore_limit(None, kv_restore)  # refuses an unknown policy before any work
        if kv_ram_bytes > 0:
            # restoring a saved state must reproduce the logits of the sequence had it stayed in the
            # cache (kv_restore = "exact"; with sequences relaid where that makes it so), or at least
            # at one thread ("complete"): checked once per model; where it holds only up to some
            # length, longer states are not saved
            self.kv_selftest = {**engine.state_selftest(), "kv_restore": kv_restore}
            restore_up_to = restore_limit(self.kv_selftest, kv_restore)
            # sequences relaid before they go on, where that is what makes restores exact: from here
            # on "relayout" says what the worker does (the test's finding stays in relayout_up_to)
            self.kv_selftest["relayout"] = relays(self.kv_selftest, kv_restore)
            self.kv_selftest["restore_up_to"] = restore_up_to
            self.log("kv_selftest", model=model, **self.kv_selftest)
            if self.engine_info is not None:
                self.engine_info = msgspec.structs.replace(self.engine_info, kv_selftest=self.kv_selftest)
        relayout = bool(self.kv_selftest and self.kv_selftest["relayout"])
        template_id = hashlib.sha256((template.name + "\0" + template.source).encode()).hexdigest()[:16]
        if kv_ram_bytes > 0 and restore_up_to != 0:
            # entries saved under another limit (kv_restore changed) are not restored under this one
            namespace = {**engine.state_key(), "prefill_chunk": prefill_chunk, "restore_up_to": restore_up_to,
                         "relayout": relayout}  # fmt: skip
            self.store = KvStore(namespace=namespace, ram_bytes=kv_ram_bytes, disk_bytes=kv_disk_bytes,
                                 directory=kv_dir, log=self.log, template=template_id)  # fmt: skip
        reuse = KvReuse(engine, n_seq=engine.n_seq_total, max_busy=engine.n_seq_max, store=self.store,
                        max_retained_tokens=max_retained_tokens, restore_up_to=restore_up_to, template_id=template_id,
                        log=self.log, relayout=relayout)  # fmt: skip
        self.scheduler = Scheduler(engine, self._emit, n_ctx=n_ctx, prefill_chunk=prefill_chunk, log=self.log, reuse=reuse,
                                   tail_grace_s=tail_grace_ms / 1000.0)  # fmt: skip
        if self.store is not None:
            self.store.on_loaded = self.scheduler.entry_loaded
        self._stop = threading.Event()
        self._router: zmq.Socket | None = None
        self._replies: zmq.Socket | None = None  # PULL: replies finished off the scheduler thread
        self._replies_endpoint = f"inproc://worker-replies-{id(self)}"
        self.embedder = Embedder(self)
        self.watch_parent: int | None = None  # exit when this process (the spawning gateway) is gone

    # ---- the scheduler thread's I/O -------------------------------------------------------
    def _emit(self, peer: bytes, tick: Tick) -> None:
        try:
            self._router.send_multipart([peer, self.codec.encode(tick)], zmq.NOBLOCK)
        except zmq.Again:  # the peer's queue is full (gateway gone or stuck): its requests time out there
            self.log("send_dropped", peer=peer.hex())

    def _pump(self, block: bool | float) -> None:
        """block: True waits up to IDLE_POLL_MS for input, a number up to that many seconds."""
        router, replies = self._router, self._replies
        timeout = IDLE_POLL_MS if block is True else int(block * 1000)
        if block and timeout > 0 and not self._outbox and not self._poller.poll(timeout):
            self._check_parent()
            return
        self._drain_wake()
        while True:  # replies computed elsewhere (embeddings): forward them
            try:
                peer, body = replies.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            router.send_multipart([peer, body])
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
        self._flush_outbox()
        self._check_parent()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full: the scheduler thread is being woken anyway

    def _post_out(self, peer: bytes, msg) -> None:
        """From a preparation thread: a reply the scheduler thread sends."""
        self._outbox.append((peer, msg))
        self._wake()

    def _flush_outbox(self) -> None:
        while self._outbox:
            peer, msg = self._outbox.popleft()
            try:
                self._router.send_multipart([peer, self.codec.encode(msg)], zmq.NOBLOCK)
            except zmq.Again:
                self.log("send_dropped", peer=peer.hex())

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
        replies = self.zctx.socket(zmq.PULL)
        replies.setsockopt(zmq.LINGER, 0)
        replies.bind(self._replies_endpoint)
        self._replies = replies
        self._poller = zmq.Poller()
        self._poller.register(router, zmq.POLLIN)
        self._poller.register(replies, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self.scheduler.waker = self._wake
        self.log("worker_ready", bind=self.bind, model=self.model, pid=os.getpid(), curve=self.curve is not None)
        try:
            self.scheduler.run(self._pump)  # returns after stop(), having aborted what was in flight
        finally:
            self.embedder.stop()
            self._prep.shutdown(wait=False, cancel_futures=True)
            router.close(0)
            replies.close(0)
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
        """run() on a thread of its own, until stop()."""
        thread = threading.Thread(target=self.run, name="scheduler", daemon=True)
        thread.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.scheduler.request_stop()
            thread.join(10)

    def run(self) -> None:
        """The scheduler loop on the calling thread, until stop(). The worker runs it on the thread
        that made every earlier decode (warm-up, KV self-test): see __main__.engine_thread."""
        if self.bind.startswith("ipc://"):
            path = Path(self.bind[len("ipc://") :])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        try:
            self._loop()
        finally:
            if self.store is not None:
                self.store.close()
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
            with self._lock:
                self._cancelled.update(k for k in ((peer, i) for i in msg.ids) if k in self._pending)
            self.scheduler.abort(msg.ids)
            self.embedder.cancel(msg.ids)
            return None
        if isinstance(msg, Embed):
            return self._embed(peer, msg)
        if isinstance(msg, GetStats):
            return self._call(msg)
        if isinstance(msg, (Tokenize, Detokenize, Render, CountTokens)):
            if not self._begin(msg.id, peer):
                return _REPLY[type(msg)](id=msg.id, error=ErrorInfo(ErrorCode.INVALID_REQUEST, f"id {msg.id!r} is already in flight", param="id"))
            self._prep.submit(self._off_thread_call, peer, msg)
            return None
        if isinstance(msg, Ping):
            return Pong(msg.nonce, self.scheduler.n_running, self.scheduler.n_waiting)
        if isinstance(msg, Connect):
            return self.hello()
        if isinstance(msg, EndSession):
            self.scheduler.end_session(msg.session)
        return None

    # ---- off the scheduler thread ----------------------------------------------------------
    def _begin(self, rid: str, peer: bytes) -> bool:
        with self._lock:
            if (peer, rid) in self._pending:
                return False
            self._pending.add((peer, rid))
            return True

    def _end(self, rid: str, peer: bytes) -> bool:
        """Forget `rid`; True when it was aborted meanwhile."""
        key = (peer, rid)
        with self._lock:
            self._pending.discard(key)
            if key in self._cancelled:
                self._cancelled.discard(key)
                return True
            return False

    def cancelled(self, rid: str, peer: bytes) -> bool:
        return (peer, rid) in self._cancelled

    def _submit(self, peer: bytes, msg: Submit):
        if msg.max_tokens is not None and msg.max_tokens < 1:
            return Tick(done=[error_done(msg.id, ErrorCode.INVALID_REQUEST, "max_tokens must be at least 1", "max_tokens")])
        if msg.logprobs is not None and not 0 <= msg.logprobs <= MAX_TOP_LOGPROBS:
            return Tick(done=[error_done(msg.id, ErrorCode.INVALID_REQUEST, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")])
        if not self._begin(msg.id, peer):
            return Tick(done=[error_done(msg.id, ErrorCode.INVALID_REQUEST, f"request id {msg.id!r} is already in flight", "id")])
        self._prep.submit(self._prepare, peer, msg)
        return None

    def _prepare(self, peer: bytes, msg: Submit) -> None:
        """On a preparation thread: the tool plan, tokens, grammar and sampler, then hand the request to the scheduler."""
        req = None
        plan = None
        try:
            if self.tools is not None and msg.messages is not None:
                self.prompts.check_tools(msg.tools)
                plan = self.tools.plan(msg)
            tokens = self.prompts.tokens(msg, plan)
            grammar, receipt = self.prompts.constraint(msg)
            if plan is not None and plan.grammar is not None:
                if grammar is not None:
                    raise PromptError(ErrorCode.INVALID_REQUEST, "a forced tool call cannot be combined with response_format", "tool_choice")
                grammar = self.prompts.checked_gbnf(plan.grammar, "tools")
            req = Request(
                msg.id, peer, tokens, sampling=msg.sampling, grammar=grammar, max_tokens=msg.max_tokens,
                session=msg.session, stop=msg.stop, ignore_eos=msg.ignore_eos, want_tokens=msg.want_tokens,
                piece=self.engine.piece,
            )  # fmt: skip
            req.schema_receipt = receipt
            req.logprobs = msg.logprobs
            req.pin_ttl_s = max(0.0, float(msg.pin_ttl_s or 0.0))
            if plan is not None:
                req.hook = plan.hook(tokens)
                req.tool_replay = plan.replay
            elif self.tools is not None and (thinking := self.tools.thinking_hook(msg)) is not None:
                req.hook = thinking(tokens)
            if not self.cancelled(msg.id, peer):
                req.sampler = self.engine.make_sampler(msg.sampling, grammar)
        except (PromptError, PlanError) as exc:
            self._end(msg.id, peer)
            self._post_out(peer, Tick(done=[error_done(msg.id, exc.code, str(exc), exc.param)]))
            return
        except EngineError as exc:
            self._end(msg.id, peer)
            param = "response_format" if msg.json_schema is not None else ("grammar" if msg.grammar is not None else None)
            code = ErrorCode(exc.code) if exc.code in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
            self._post_out(peer, Tick(done=[error_done(msg.id, code, f"cannot build the sampler: {exc}", param)]))
            return
        except Exception as exc:  # noqa: BLE001 - a bug in preparing one request fails that request only
            self.log("prepare_error", id=msg.id, error=repr(exc))
            self._end(msg.id, peer)
            self._post_out(peer, Tick(done=[error_done(msg.id, ErrorCode.INTERNAL, "the worker could not prepare the request")]))
            return
        key = (peer, msg.id)
        with self._lock:  # an Abort either finds it here (cancelled) or, once submitted, in the scheduler
            self._pending.discard(key)
            aborted = key in self._cancelled
            self._cancelled.discard(key)
            if not aborted:
                self.scheduler.submit(req)
        if aborted:
            if req.sampler is not None:
                req.sampler.free()
            self._post_out(peer, Tick(done=[Done(msg.id, FinishReason.ABORT)]))

    def _off_thread_call(self, peer: bytes, msg) -> None:
        try:
            if self.cancelled(msg.id, peer):
                result = _REPLY[type(msg)](id=msg.id, error=ErrorInfo(ErrorCode.INVALID_REQUEST, "the request was aborted"))
            else:
                result = self._call(msg)
        except Exception as exc:  # noqa: BLE001 - a bug fails this call, not the thread
            self.log("call_error", call=type(msg).__name__, error=repr(exc))
            result = _REPLY[type(msg)](id=msg.id, error=ErrorInfo(ErrorCode.INTERNAL, "internal error in the worker"))
        self._end(msg.id, peer)
        self._post_out(peer, result)

    def _embed(self, peer: bytes, msg: Embed):
        if not msg.inputs:
            return EmbedResult(id=msg.id, error=ErrorInfo(ErrorCode.INVALID_REQUEST, "input must not be empty", param="input"))
        n_vocab = self.engine.n_vocab
        for i, item in enumerate(msg.inputs):
            if isinstance(item, list) and any(not 0 <= t < n_vocab for t in item):
                bad = next(t for t in item if not 0 <= t < n_vocab)
                return EmbedResult(id=msg.id, error=ErrorInfo(
                    ErrorCode.INVALID_REQUEST, f"input[{i}] has token id {bad}, outside the vocabulary (0..{n_vocab - 1})",
                    param=f"input[{i}]"))  # fmt: skip
        for i, item in enumerate(msg.inputs):
            if isinstance(item, str) and len(item) > self.prompts.max_chars:
                return EmbedResult(id=msg.id, error=ErrorInfo(
                    ErrorCode.CONTEXT_LENGTH, f"input[{i}] has {len(item)} characters, more than {self.n_ctx} tokens can hold",
                    param=f"input[{i}]"))  # fmt: skip
        self.embedder.submit(peer, msg)
        return None

    def _call(self, msg):
        e = self.engine
        try:
            if isinstance(msg, (Tokenize, CountTokens)) and msg.text is not None:
                self.prompts.check_chars(len(msg.text), "text")
            if isinstance(msg, Tokenize):
                return TokenizeResult(id=msg.id, tokens=e.tokenize(msg.text, msg.add_special, msg.parse_special))
            if isinstance(msg, Detokenize):
                return DetokenizeResult(id=msg.id, text=e.detokenize(msg.tokens))
            if isinstance(msg, Render):
                extra = template_switches(msg.template_kwargs)
                return RenderResult(id=msg.id, text=self.prompts.render(msg.messages, msg.tools, msg.add_generation_prompt, extra))
            if isinstance(msg, CountTokens):
                if msg.messages is not None:
                    return CountResult(id=msg.id, count=len(self.prompts.tokenize_messages(msg.messages, msg.tools, msg.add_generation_prompt, bounded=False)))
                return CountResult(id=msg.id, count=len(e.tokenize(msg.text or "", msg.add_special, msg.parse_special)))
            if isinstance(msg, GetStats):
                stats = {"model": self.model, "pid": os.getpid(), **self._engine_stats(), **self.scheduler.stats()}
                if self.tools is not None and self.tools.replay is not None:
                    stats["tool_replay_lookups"] = dict(self.tools.replay.counts)
                if self.kv_selftest is not None:
                    stats["kv_selftest"] = self.kv_selftest
                return StatsResult(id=msg.id, stats=stats)
        except PromptError as exc:
            return _REPLY[type(msg)](id=msg.id, error=ErrorInfo(exc.code, str(exc), param=exc.param))
        except TemplateError as exc:
            return _REPLY[type(msg)](id=msg.id, error=ErrorInfo(ErrorCode.TEMPLATE, str(exc)))
        except EngineError as exc:
            return _REPLY[type(msg)](id=msg.id, error=ErrorInfo(exc.code, str(exc), param="input"))
        return None


_REPLY = {Tokenize: TokenizeResult, Detokenize: DetokenizeResult, Render: RenderResult, CountTokens: CountResult,
          GetStats: StatsResult}  # fmt: skip


class Embedder:
    """Embeddings on a thread of their own, one input at a time; an Abort naming a job stops it
    between inputs. Replies go back through an inproc socket that the scheduler thread forwards.

    The thread ends when no job is left and a new one starts with the next: with llama.cpp's OpenMP
    builds a live second thread that has computed a graph keeps a thread team that throttles the
    scheduler thread's (measured: 24 ms a token before one embedding request, 42 after it while
    the embedding thread lived, on 2 cores)."""

    def __init__(self, server: WorkerServer) -> None:
        self.server = server
        self._jobs: deque = deque()
        self._cancelled: set[str] = set()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, peer: bytes, msg: Embed) -> None:
        with self._lock:
            self._pending.add(msg.id)
            self._jobs.append((peer, msg))
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="embedder", daemon=True)
                self._thread.start()

    def cancel(self, ids: list[str]) -> None:
        with self._lock:
            self._cancelled.update(i for i in ids if i in self._pending)

    def stop(self) -> None:
        """No new thread starts; the running one finishes the jobs it has (waited for up to 5 s)."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        if thread is not None:
            thread.join(5)

    @property
    def running(self) -> bool:
        """Whether an embedding thread is alive (it ends when it runs out of jobs)."""
        with self._lock:
            return self._thread is not None

    def _run(self) -> None:
        server = self.server
        push = server.zctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(server._replies_endpoint)
        try:
            while True:
                with self._lock:
                    if not self._jobs:
                        self._thread = None  # the next job starts a new thread
                        return
                    peer, msg = self._jobs.popleft()
                reply = self._embed(msg)
                with self._lock:
                    self._pending.discard(msg.id)
                    self._cancelled.discard(msg.id)
                push.send_multipart([peer, server.codec.encode(reply)])
        finally:
            push.close(0)

    def _embed(self, msg: Embed) -> EmbedResult:
        vectors: list[list[float]] = []
        total = 0
        try:
            for i, item in enumerate(msg.inputs):
                if msg.id in self._cancelled:
                    return EmbedResult(id=msg.id, error=ErrorInfo(ErrorCode.INVALID_REQUEST, "the request was aborted"))
                try:
                    vecs, n = self.server.engine.embed([item])
                except EngineError as exc:
                    return EmbedResult(id=msg.id, error=ErrorInfo(exc.code, str(exc).replace("input[0]", f"input[{i}]"), param="input"))
                vectors.extend(vecs)
                total += n
        except Exception as exc:  # noqa: BLE001 - a bug fails this request, not the thread
            self.server.log("embed_error", error=repr(exc))
            return EmbedResult(id=msg.id, error=ErrorInfo(ErrorCode.INTERNAL, f"internal error while embedding: {exc!r}"))
        return EmbedResult(id=msg.id, embeddings=vectors, count=total)
