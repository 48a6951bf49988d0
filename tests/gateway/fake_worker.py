"""A scripted worker speaking the real protocol over a real ZeroMQ ROUTER, for gateway tests.

In process (`FakeWorker`, asyncio) or as a child process (`python -m tests.gateway.fake_worker
--bind ...`, the worker's command line). Script for a Submit: the words of the last message (or
of the prompt) come back one per tick; max_tokens cuts with finish_reason length. Magic words:
  TOOLONG  -> Done(error=CONTEXT_LENGTH) before any output
  STALL    -> output stops there until the request is aborted
  CRASH    -> the worker dies after the words before it (a child process exits with code 3)
  THINK:x  -> a ThinkingPart "x" instead of text
  CALL:name:{json} -> a tool call (start, argument text in two pieces, end) with id "fc<n>"; the turn then
                      ends as tool_calls
  HALFCALL:name:{json} -> a tool call that starts and never ends (cut by max_tokens on the next word)
  SLOW     -> a pause of `slow_s` before the next word (a long prefill)
  FAIL     -> the request ends with a decode_failed error after the words before it
  NOEMBED  -> (an embedding input) a typed UNSUPPORTED error
  FREEZE   -> the worker stops answering anything (pings included) but stays alive: a hung worker
  GARBLE   -> a Tick naming the request that this protocol version cannot decode (an unknown part
              type), then the request's remaining words as if nothing happened
  NOKEEP   -> the request's cache is not kept (its Done says it committed nothing)
  EVICTED  -> the worker explains a cache miss: Accepted.cache_miss and CacheInfo.miss "evicted"
Every request is first answered with Accepted (prompt tokens = words of the messages + one per tool,
cached 2); CountTokens of messages counts the same way. A request's Done says its evaluated prompt
tokens (prompt - cached) stay cached for the next one (CacheInfo.committed_tokens), as a real worker
whose sequence is kept does.
An Embed with an input containing STALL is never answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

import msgspec
import zmq
import zmq.asyncio

from barrel_inference.protocol import (
    PROTOCOL_VERSION, REPLY_OF, Abort, Accepted, Connect, Delta, Done, Embed, EmbedResult, ErrorCode, ErrorInfo,
    FinishReason, GetStats, Hello, Ping, Pong, StatsResult, Submit, TextPart, ThinkingPart, Tick, Timings, Tokenize, TokenizeResult,
    ToolCallArgs, ToolCallEnd, ToolCallStart, Usage, WorkerCodec, CountResult, CountTokens, Detokenize, DetokenizeResult,
    Render, RenderResult, CacheInfo,
)  # fmt: skip
from barrel_inference.protocol import HelperCall


def script_of(submit: Submit, words: list[str] | None = None) -> list[str]:
    if submit.messages:
        return submit.messages[-1].content.split()
    if submit.prompt is not None:
        return submit.prompt.split()
    words = words or []
    return [words[t] if 0 <= t < len(words) else f"t{t}" for t in submit.prompt_tokens or []]


class FakeWorker:
    def __init__(self, *, bind: str = "tcp://127.0.0.1:0", model: str = "fake:latest", n_seq_max: int = 4,
                 tick_s: float = 0.002, cached_tokens: int = 2, on_crash=None) -> None:  # fmt: skip
        self.bind = bind
        self.model = model
        self.n_seq_max = n_seq_max
        self.tick_s = tick_s
        self.cached_tokens = cached_tokens
        self.slow_s = 0.3  # the pause of the magic word SLOW
        self.on_crash = on_crash
        self.endpoint = ""
        self.codec = WorkerCodec()
        self.connects = 0
        self.submits: list[Submit] = []
        self.aborts: list[str] = []
        self.calls: list = []
        self.pings = 0
        self.answer_pings = True
        self.frozen = False
        self._running: dict[str, asyncio.Task] = {}
        self._ctx = zmq.asyncio.Context()
        self._sock = None
        self._loop_task = None
        self.alive = False
        self.words: list[str] = []  # the fake vocabulary: a token id is a word's index, in order of first use

    def token_of(self, word: str) -> int:
        if word not in self.words:
            self.words.append(word)
        return self.words.index(word)

    async def start(self) -> str:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.bind.endswith(":0"):
            port = sock.bind_to_random_port(self.bind[: -len(":0")])
            self.endpoint = f"{self.bind[: -len(':0')]}:{port}"
        else:
            sock.bind(self.bind)
            self.endpoint = self.bind
        self._sock = sock
        self.alive = True
        self._loop_task = asyncio.create_task(self._serve())
        return self.endpoint

    async def restart(self) -> None:
        """Come back on the same endpoint (after `kill`), as a restarted worker would."""
        self.bind = self.endpoint
        await self.start()

    async def kill(self) -> None:
        """Die without a word: no Done for anything in flight."""
        self.alive = False
        for task in list(self._running.values()):
            task.cancel()
        if self._loop_task is not None and self._loop_task is not asyncio.current_task():
            self._loop_task.cancel()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def stop(self) -> None:
        await self.kill()
        self._ctx.destroy(linger=0)  # closes any socket still open (term() would wait on it forever)

    async def _send(self, peer: bytes, msg) -> None:
        if self._sock is not None:
            await self._sock.send_multipart([peer, self.codec.encode(msg)])

    async def _serve(self) -> None:
        while True:
            peer, body = await self._sock.recv_multipart()
            if self.frozen:
                continue
            msg = self.codec.decode(body)
            if isinstance(msg, Connect):
                self.connects += 1
                await self._send(peer, self.hello())
            elif isinstance(msg, Submit):
                self.submits.append(msg)
                self._running[msg.id] = asyncio.create_task(self._generate(peer, msg))
            elif isinstance(msg, Abort):
                for rid in msg.ids:
                    self.aborts.append(rid)
                    task = self._running.pop(rid, None)
                    if task is not None:
                        task.cancel()
                        await self._send(peer, Tick(done=[Done(id=rid, finish_reason=FinishReason.ABORT)]))
            elif isinstance(msg, HelperCall.__args__):
                self.calls.append(msg)
                result = self.call(msg)
                if result is not None:  # None: a call that never ends (until the gateway gives up on it)
                    await self._send(peer, result)
            elif isinstance(msg, Ping):
                self.pings += 1
                if self.answer_pings:
                    await self._send(peer, Pong(nonce=msg.nonce, running=len(self._running)))

    def hello(self) -> Hello:
        return Hello(protocol_version=PROTOCOL_VERSION, model=self.model, architecture="fake", n_ctx=512,
                     n_ctx_train=512, n_seq_max=self.n_seq_max, n_vocab=256, chat_template="chatml", pid=os.getpid())  # fmt: skip

    def call(self, msg):
        if isinstance(msg, GetStats):
            return StatsResult(id=msg.id, stats={"submits": len(self.submits), "running": len(self._running),
                                                 "submit_ids": [s.id for s in self.submits][-64:], "pid": os.getpid(),
                                                 "profile": {"decode_ms": 1.5, "sample_ms": 0.25}})  # fmt: skip
        if isinstance(msg, CountTokens):
            return CountResult(id=msg.id, count=prompt_size(msg.messages or [], msg.tools) if msg.messages is not None
                               else len((msg.text or "").split()))  # fmt: skip
        if isinstance(msg, Tokenize):
            return TokenizeResult(id=msg.id, tokens=[self.token_of(w) for w in (msg.text or "").split()])
        if isinstance(msg, Detokenize):
            return DetokenizeResult(id=msg.id, text=" ".join(self.words[t] for t in msg.tokens if 0 <= t < len(self.words)))
        if isinstance(msg, Render):  # the fake chat template: the contents, space-separated
            return RenderResult(id=msg.id, text=" ".join(m.content for m in msg.messages))
        if isinstance(msg, Embed) and any(isinstance(i, str) and "STALL" in i for i in msg.inputs):
            return None
        if isinstance(msg, Embed):  # a vector of 4 per input: [len, vowels, 1, 0] normalised
            if any(isinstance(item, str) and "TOOLONG" in item for item in msg.inputs):
                return EmbedResult(id=msg.id, error=ErrorInfo(ErrorCode.CONTEXT_LENGTH, "input is longer than the context", param="input"))
            if "NOEMBED" in msg.inputs:
                return EmbedResult(id=msg.id, error=ErrorInfo(ErrorCode.UNSUPPORTED, "this model cannot embed", param="input"))
            vecs = []
            for item in msg.inputs:
                n = len(item) if isinstance(item, list) else len(item.split())
                v = [float(n), float(sum(c in "aeiou" for c in item) if isinstance(item, str) else 0), 1.0, 0.0]
                norm = sum(x * x for x in v) ** 0.5
                vecs.append([x / norm for x in v])
            return EmbedResult(id=msg.id, embeddings=vecs, count=sum(len(i) if isinstance(i, list) else len(i.split()) for i in msg.inputs))
        return REPLY_OF[type(msg)](id=msg.id, error=ErrorInfo(ErrorCode.UNSUPPORTED, f"unsupported call {type(msg).__name__}"))

    async def _generate(self, peer: bytes, s: Submit) -> None:
        words = script_of(s, self.words)
        prompt_tokens = prompt_size(s.messages, s.tools) if s.messages else len(words)
        usage = Usage(prompt_tokens=prompt_tokens, cached_tokens=min(self.cached_tokens, prompt_tokens))
        try:
            if "TOOLONG" in words:
                err = ErrorInfo(ErrorCode.CONTEXT_LENGTH, f"the prompt ({prompt_tokens} tokens) is longer than the context (4)", param="messages")  # fmt: skip
                await self._send(peer, Tick(done=[Done(id=s.id, finish_reason=FinishReason.ERROR, usage=usage, error=err)]))
                return
            miss = "evicted" if "EVICTED" in words else ""
            await self._send(peer, Tick(accepted=[Accepted(id=s.id, prompt_tokens=prompt_tokens, cached_tokens=usage.cached_tokens, n_ctx=512,
                                                           cache_miss=miss)]))  # fmt: skip
            n = n_calls = 0
            for word in words:
                if word == "SLOW":
                    await asyncio.sleep(self.slow_s)
                    continue
                if word == "FAIL":
                    usage.completion_tokens = n
                    err = ErrorInfo(ErrorCode.DECODE_FAILED, "llama_decode failed (-3); the context was recreated")
                    await self._send(peer, Tick(done=[Done(id=s.id, finish_reason=FinishReason.ERROR, usage=usage, error=err)]))
                    return
                if word == "STALL":
                    await asyncio.Event().wait()
                if word == "FREEZE":
                    self.frozen = True
                    await asyncio.Event().wait()
                if word == "GARBLE":
                    bad = {"kind": "tick", "deltas": [{"id": s.id, "parts": [{"type": "hologram", "text": "?"}]}]}
                    if self._sock is not None:
                        await self._sock.send_multipart([peer, msgspec.msgpack.encode(bad)])
                    continue
                if word == "CRASH":
                    await asyncio.sleep(0.05)  # let the output so far leave the socket
                    if self.on_crash is not None:
                        self.on_crash()
                    await self.kill()
                    return
                if s.max_tokens is not None and n >= s.max_tokens:
                    usage.completion_tokens = n
                    await self._send(peer, Tick(done=[Done(id=s.id, finish_reason=FinishReason.LENGTH, usage=usage, timings=Timings(1.0, 2.0, 3.0))]))  # fmt: skip
                    return
                await asyncio.sleep(self.tick_s)
                n += 1
                if word.startswith(("CALL:", "HALFCALL:")):
                    parts = _call_parts(word, n_calls)
                    n_calls += word.startswith("CALL:")
                else:
                    parts = [_part(word, n)]
                tokens = [self.token_of(word)] if s.want_tokens else []
                await self._send(peer, Tick(deltas=[Delta(id=s.id, parts=parts, tokens=tokens, n_tokens=1)]))
            usage.completion_tokens = n
            reason = FinishReason.TOOL_CALLS if n_calls else FinishReason.STOP
            evaluated = usage.prompt_tokens - usage.cached_tokens
            cache = CacheInfo(kind="prefix", evaluated_tokens=evaluated, committed_tokens=0 if "NOKEEP" in words else evaluated, miss=miss)
            await self._send(peer, Tick(done=[Done(id=s.id, finish_reason=reason, usage=usage, timings=Timings(1.0, 2.0, 3.0), cache=cache)]))  # fmt: skip
        finally:
            self._running.pop(s.id, None)


def prompt_size(messages, tools) -> int:
    return sum(len(m.content.split()) for m in messages) + len(tools or [])


def _call_parts(word: str, index: int) -> list:
    kind, name, arguments = word.split(":", 2)
    half = len(arguments) // 2
    parts = [ToolCallStart(index=index, id=f"fc{index}", name=name),
             ToolCallArgs(index=index, text=arguments[:half]), ToolCallArgs(index=index, text=arguments[half:])]  # fmt: skip
    if kind == "CALL":
        parts.append(ToolCallEnd(index=index, arguments=arguments, raw=f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'))
    return parts


def _part(word: str, n: int):
    if word.startswith("THINK:"):
        return ThinkingPart(word[len("THINK:"):])
    return TextPart(word if n == 1 else " " + word)



async def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bind", required=True)
    p.add_argument("--model-name", required=True)
    p.add_argument("--n-seq-max", type=int, default=4)
    p.add_argument("--start-delay", type=float, default=0.0, help="sleep before binding (a slow model load)")
    p.add_argument("--fail-start", action="store_true", help="exit with code 2 before binding")
    p.add_argument("--argv-file", default=None, help="write the command line here (tests check the flags)")
    p.add_argument("--pid-file", default=None)
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (a stuck worker)")
    p.add_argument("--cpu-affinity", default=None, help="pin to these cores, as the real worker does")
    p.add_argument("--env-file", default=None, help="write the device environment and the affinity here (JSON)")
    args, _rest = p.parse_known_args(argv)
    if args.argv_file:
        with open(args.argv_file, "a") as f:
            f.write(" ".join(argv) + "\n")
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(str(os.getpid()))
    if args.cpu_affinity:
        from barrel_inference.worker.__main__ import pin_cores

        pin_cores(args.cpu_affinity)
    if args.env_file:
        seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")}
        seen["cores"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        with open(args.env_file, "a") as f:
            f.write(json.dumps({"bind": args.bind, **seen}) + "\n")
    if args.fail_start:
        # free text another client's request may have put in the log, then the worker's typed failure
        print("fake worker: request req-other prompt 'secret text of another client'", file=sys.stderr, flush=True)
        print(json.dumps({"event": "worker_failed", "error": "cannot load model"}), file=sys.stderr, flush=True)
        return 2
    await asyncio.sleep(args.start_delay)
    worker = FakeWorker(bind=args.bind, model=args.model_name, n_seq_max=args.n_seq_max, on_crash=lambda: os._exit(3))
    await worker.start()
    print('{"event": "fake_worker_ready", "pid": %d}' % os.getpid(), file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
