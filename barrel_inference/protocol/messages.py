"""msgspec Structs for the link. Two tagged unions: ToWorker (gateway -> worker) and FromWorker.

Rules for changing the link:
- Fields: every new field gets a default, so an old peer keeps decoding (unknown fields are ignored).
- Enum values (ErrorCode, FinishReason, the Part and message tags): a new value is a change an old peer
  cannot act on, so it bumps PROTOCOL_VERSION together with the code that sends it. Decoding stays
  lenient anyway: an unknown ErrorCode becomes INTERNAL (naming the value), an unknown FinishReason
  fails that one request with a typed error, never the whole message.
- Anything else an old peer cannot ignore (a removed or retyped field, new meaning for an old one)
  bumps PROTOCOL_VERSION; gateway and worker refuse to talk across versions.

Version history: 1 first link; 2 typed Delta parts, Accepted, one Struct per helper call,
finish reason "tool_calls", error codes queue_timeout / not_found / method_not_allowed / request_too_large /
tool_call_invalid, forbidden / unsupported_media_type (gateway-side), Submit's tool_choice / parallel_tool_calls /
template_kwargs / thinking_budget, Accepted.cache / cache_miss; 3 error codes output_invalid and invalid_api_key,
Submit.json_schema_strict, Accepted.schema_receipt, Delta.logprobs. Fields added since, with defaults an
old peer ignores: Submit.pin_ttl_s, CacheInfo.committed_tokens, Render.template_kwargs.
"""

from __future__ import annotations

import enum
from typing import Union

import msgspec

PROTOCOL_VERSION = 3

__all__ = [
    "PROTOCOL_VERSION",
    "ErrorCode",
    "FinishReason",
    "ErrorInfo",
    "ChatMessage",
    "ToolCall",
    "Sampling",
    "Connect",
    "Submit",
    "Abort",
    "EndSession",
    "Tokenize",
    "Detokenize",
    "Render",
    "CountTokens",
    "GetStats",
    "Embed",
    "HelperCall",
    "Ping",
    "Hello",
    "TextPart",
    "ThinkingPart",
    "ToolCallStart",
    "ToolCallArgs",
    "ToolCallEnd",
    "Part",
    "SchemaReceipt",
    "Accepted",
    "EngineInfo",
    "TopLogprob",
    "TokenLogprob",
    "Delta",
    "Usage",
    "Timings",
    "CacheInfo",
    "Done",
    "Tick",
    "Reply",
    "TokenizeResult",
    "DetokenizeResult",
    "RenderResult",
    "CountResult",
    "StatsResult",
    "EmbedResult",
    "HelperReply",
    "Pong",
    "ToWorker",
    "FromWorker",
    "merge_parts",
    "REPLY_OF",
]


class ErrorCode(str, enum.Enum):
    """Typed error codes. Each API family maps them to its own error body and status."""

    INVALID_REQUEST = "invalid_request"  # a field the engine cannot accept
    CONTEXT_LENGTH = "context_length_exceeded"  # prompt (+ max tokens) longer than the context
    MODEL_NOT_FOUND = "model_not_found"
    GRAMMAR = "grammar_error"  # the grammar did not parse
    TEMPLATE = "template_error"  # the chat template failed to render
    OVERLOADED = "overloaded"  # admission queue full
    QUEUE_TIMEOUT = "queue_timeout"  # waited in the admission queue past its timeout
    WORKER_UNAVAILABLE = "worker_unavailable"  # the worker died, stopped answering or could not start
    DECODE_FAILED = "decode_failed"  # llama_decode failed; the context was recreated
    UNSUPPORTED = "unsupported"
    TOOL_CALL_INVALID = "tool_call_invalid"  # the model wrote a tool call that does not parse or fails its schema
    UNAUTHENTICATED = "invalid_api_key"  # a protected route without a key this server knows for it
    OUTPUT_INVALID = "output_invalid"  # finished structured output that does not validate against its schema
    NOT_FOUND = "not_found"  # no such route
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TOO_LARGE = "request_too_large"  # the body is over max_request_body_bytes
    FORBIDDEN = "forbidden"  # a Host or web Origin this server does not answer (browser safety)
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # a body that is not JSON on a JSON route
    INTERNAL = "internal"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS / end-of-generation token or a stop sequence
    LENGTH = "length"  # max tokens or the context filled up
    TOOL_CALLS = "tool_calls"  # the model called tools (the output ends with tool-call parts)
    ABORT = "abort"  # cancelled by the gateway (client disconnect, unload)
    ERROR = "error"  # see Done.error


class ErrorInfo(msgspec.Struct, omit_defaults=True):
    """A typed error. `code` is an ErrorCode once decoded (an unknown value decodes as INTERNAL)."""

    code: str
    message: str
    retryable: bool = False
    param: str | None = None  # the offending field, where there is one

    def __post_init__(self) -> None:
        if not isinstance(self.code, ErrorCode):
            try:
                self.code = ErrorCode(self.code)
            except ValueError:
                self.message = f"{self.message} (error code {self.code!r}, unknown to this side of the link)"
                self.code = ErrorCode.INTERNAL


class ToolCall(msgspec.Struct, omit_defaults=True):
    """A tool call in engine terms: a name and its arguments as a JSON text."""

    name: str
    arguments: str = "{}"
    id: str | None = None


class ChatMessage(msgspec.Struct, omit_defaults=True):
    """One chat turn as a template sees it. `content` is plain text (images are not carried)."""

    role: str
    content: str = ""
    name: str | None = None
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    thinking: str | None = None


class Sampling(msgspec.Struct, omit_defaults=True):
    """Sampler-chain parameters. temperature <= 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0  # locally typical sampling; 1.0 = off
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] = {}


# ---- gateway -> worker ---------------------------------------------------------------


class Connect(msgspec.Struct, tag="connect", tag_field="kind"):
    """A gateway's first message; the worker answers with Hello."""

    protocol_version: int = PROTOCOL_VERSION
    client: str = ""


class Submit(msgspec.Struct, tag="submit", tag_field="kind", omit_defaults=True):
    """Start a generation. Exactly one of messages / prompt / prompt_tokens is set."""

    id: str
    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    tools: list[dict] | None = None  # JSON-Schema tool definitions, handed to the template
    tool_choice: str | dict | None = None  # "auto" | "none" | "required" | {"type": "function", "function": {"name": …}}
    parallel_tool_calls: bool = True  # False: at most one call per turn
    template_kwargs: dict = {}  # the template's own switches: enable_thinking, reasoning_effort, …
    thinking_budget: int | None = None  # tokens of thinking before the end marker is forced
    add_generation_prompt: bool = True
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    stop: list[str] = []
    max_tokens: int | None = None  # None: until EOS or the context is full
    grammar: str | None = None  # GBNF
    json_schema: dict | None = None  # constrain output to JSON matching this schema ({} = any JSON object)
    json_schema_strict: bool = False
    suffix: str | None = None  # with prompt: fill in the middle between prompt and suffix (models with FIM tokens)
    logprobs: int | None = None  # None: none; k (0..20): each sampled token's log-probability and the k most likely  # refuse a schema keyword the grammar cannot enforce (instead of checking it after)
    session: str | None = None
    ignore_eos: bool = False
    want_tokens: bool = False  # carry token ids in deltas
    # keep this request's cache (its sequence, or its saved state in the tiers) for this many seconds
    # before retention may drop it for others' sake; 0: no pin (the usual least-recently-used order)
    pin_ttl_s: float = 0.0


class Abort(msgspec.Struct, tag="abort", tag_field="kind"):
    """Cancel requests; idempotent. Each still running ends with Done(abort)."""

    ids: list[str]


class EndSession(msgspec.Struct, tag="end_session", tag_field="kind"):
    session: str


# ---- helper calls: one Struct per call, each answered by its own Reply ----------------------


class Tokenize(msgspec.Struct, tag="tokenize", tag_field="kind", omit_defaults=True):
    """text -> TokenizeResult.tokens"""

    id: str
    text: str
    add_special: bool = True
    parse_special: bool = True


class Detokenize(msgspec.Struct, tag="detokenize", tag_field="kind", omit_defaults=True):
    """tokens -> DetokenizeResult.text"""

    id: str
    tokens: list[int]


class Render(msgspec.Struct, tag="render", tag_field="kind", omit_defaults=True):
    """messages (+tools) through the chat template -> RenderResult.text"""

    id: str
    messages: list[ChatMessage]
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    template_kwargs: dict = {}  # the template's own switches (enable_thinking, reasoning_effort, ...)


class CountTokens(msgspec.Struct, tag="count_tokens", tag_field="kind", omit_defaults=True):
    """The prompt tokens of text, or of messages (+tools) as rendered -> CountResult.count"""

    id: str
    text: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    add_special: bool = True
    parse_special: bool = True


class GetStats(msgspec.Struct, tag="stats", tag_field="kind", omit_defaults=True):
    """-> StatsResult.stats (scheduler figures, per-tick profile)"""

    id: str


class Embed(msgspec.Struct, tag="embed", tag_field="kind", omit_defaults=True):
    """Inputs (texts or token ids) -> EmbedResult: mean-pooled, L2-normalised vectors, tokens read.

    The worker computes them off its scheduler thread; an Abort naming this id stops it between inputs.
    """

    id: str
    inputs: list[Union[str, list[int]]]


HelperCall = Union[Tokenize, Detokenize, Render, CountTokens, GetStats, Embed]


class Ping(msgspec.Struct, tag="ping", tag_field="kind"):
    nonce: int = 0


ToWorker = Union[Connect, Submit, Abort, EndSession, Tokenize, Detokenize, Render, CountTokens, GetStats, Embed, Ping]


# ---- worker -> gateway ---------------------------------------------------------------


class EngineInfo(msgspec.Struct, omit_defaults=True):
    """How the worker's engine was loaded: its profile, and what the build and CPU gave it."""

    profile: str = "default"  # "default" or "safe" (extra buffer types off after a crash)
    extra_buffers: bool = True  # llama.cpp's extra buffer types (CPU repack, AMX layouts) in use
    reason: str = ""  # why extra buffers are on or off
    weight_buffers: list[str] = []  # buffer types holding the weights (CPU, CPU_REPACK, AMX, CUDA0, ...)
    system_info: str = ""  # llama.cpp's llama_print_system_info()
    llama_cpp_version: str = ""
    warmup_ms: float = 0.0
    # the load-time check that a saved KV state restores exactly: {"exact_up_to" / "complete_up_to":
    # tokens or None (no limit), "probes": [{"tokens", "exact", "complete", "max_abs_diff"}],
    # "flash_attn", "kv_restore": the policy, "restore_up_to": what the tiers keep under it}; None
    # when the tiers are off (see worker/kvselftest.py)
    kv_selftest: dict | None = None
    # the KV layout (True: one buffer for all sequences, False: a buffer per sequence id) and why
    # (kvlayout.py: "set", or what kv_unified = "auto" weighed); None from older workers
    kv_unified: bool | None = None
    kv_layout: str = ""


class Hello(msgspec.Struct, tag="hello", tag_field="kind", omit_defaults=True):
    protocol_version: int
    model: str
    architecture: str
    n_ctx: int
    n_ctx_train: int
    n_seq_max: int
    n_vocab: int
    chat_template: str  # "gguf" or the name of the built-in template in use
    chat_template_source: str = ""  # the Jinja text in use
    bos_token: str = ""
    eos_token: str = ""
    pid: int = 0
    engine: str = "llama.cpp"
    engine_info: EngineInfo | None = None


# Delta.parts: ordered, typed output. A tagged union on "type"; new kinds get new tags (see the rules).


class TextPart(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ThinkingPart(msgspec.Struct, tag="thinking", tag_field="type"):
    text: str


class ToolCallStart(msgspec.Struct, tag="tool_call_start", tag_field="type"):
    """A tool call begins. `id` is family-neutral; each API family adds its own prefix."""

    index: int
    id: str
    name: str


class ToolCallArgs(msgspec.Struct, tag="tool_call_args", tag_field="type"):
    """More of tool call `index`'s argument text, as the model writes it."""

    index: int
    text: str


class ToolCallEnd(msgspec.Struct, tag="tool_call_end", tag_field="type", omit_defaults=True):
    """Tool call `index` is complete: its canonical JSON arguments and the exact captured text."""

    index: int
    arguments: str = "{}"
    raw: str = ""


Part = Union[TextPart, ThinkingPart, ToolCallStart, ToolCallArgs, ToolCallEnd]


def merge_parts(into: list, parts: list) -> None:
    """Append `parts` to `into`, keeping order and joining a part onto the last one where they are
    the same kind (text after text, thinking after thinking, argument text of the same call)."""
    for part in parts:
        last = into[-1] if into else None
        if type(part) is type(last) and type(part) in (TextPart, ThinkingPart):
            into[-1] = type(part)(last.text + part.text)
        elif type(part) is ToolCallArgs and type(last) is ToolCallArgs and last.index == part.index:
            into[-1] = ToolCallArgs(part.index, last.text + part.text)
        else:
            into.append(part)


class SchemaReceipt(msgspec.Struct, omit_defaults=True):
    """What a JSON-schema constraint does with the schema's keywords: enforced by the grammar, checked
    against the finished text, or neither."""

    enforced: list[str] = []
    checked: list[str] = []
    unenforced: list[str] = []


class Accepted(msgspec.Struct, omit_defaults=True):
    """The prompt is tokenised and the request holds a sequence: sent before any output."""

    id: str
    prompt_tokens: int
    cached_tokens: int = 0  # prompt tokens found in the sequence's KV cache
    n_ctx: int = 0  # the sequence's context (prompt + output)
    tool_replay: dict[str, int] = {}  # replay-map lookups for the history's tool calls: hit / miss / no_format -> count
    cache: str = ""  # how the cached prefix was found (CacheInfo.kind)
    cache_miss: str = ""  # why a known session reused less than its last turn committed (CacheInfo.miss)
    schema_receipt: SchemaReceipt | None = None  # set when the request has a json_schema


class TopLogprob(msgspec.Struct, array_like=True):
    token: int
    logprob: float
    piece: bytes  # the token's bytes


class TokenLogprob(msgspec.Struct, omit_defaults=True):
    """A sampled token's log-probability under the sampler's distribution (after logit bias), and the
    most likely alternatives at that step."""

    token: int
    logprob: float
    piece: bytes = b""  # the token's bytes
    top: list[TopLogprob] = []


class Delta(msgspec.Struct, omit_defaults=True):
    """New output of one request since the last tick: ordered typed parts."""

    id: str
    parts: list[Part] = []
    tokens: list[int] = []
    n_tokens: int = 0  # tokens generated this tick (parts may lag behind tokens)
    logprobs: list[TokenLogprob] = []  # one per sampled token (Submit.logprobs set), in order

    @property
    def text(self) -> str:
        """The visible text of this delta (its TextParts joined)."""
        return "".join(p.text for p in self.parts if type(p) is TextPart)


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Timings(msgspec.Struct):
    """Milliseconds. queue: submit -> first prefill chunk; prefill: -> first token; decode: the rest."""

    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


class CacheInfo(msgspec.Struct, omit_defaults=True):
    """How a request's prompt prefix was found, and the worker's saved-state tiers after it.

    kind: sticky (the session's own sequence), prefix (an idle cache the prompt extends), copy (a
    prefix copied from another sequence), ram / disk (a saved state restored), cold (nothing).
    miss: why a known session reused less than its previous turn committed: "evicted",
    "diverged-at=<token index>", "template-changed" or "model-reloaded"; empty otherwise.
    """

    kind: str = "cold"
    miss: str = ""
    evaluated_tokens: int = 0  # prompt tokens computed (prompt_tokens - cached_tokens)
    # of those, the ones that stay in the worker's cache after the request (its sequence is kept for
    # reuse): what this request newly committed for the next one; 0 when its cache was dropped
    committed_tokens: int = 0
    ram_bytes: int = 0
    ram_entries: int = 0
    disk_bytes: int = 0
    disk_entries: int = 0
    evictions: int = 0  # caches taken out of sequences so far (saved to a tier or lost)


class Done(msgspec.Struct, omit_defaults=True):
    """A request's end. `finish_reason` is a FinishReason once decoded: an unknown value fails the request."""

    id: str
    finish_reason: str
    stop_sequence: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    timings: Timings = msgspec.field(default_factory=Timings)
    error: ErrorInfo | None = None
    cache: CacheInfo | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.finish_reason, FinishReason):
            try:
                self.finish_reason = FinishReason(self.finish_reason)
            except ValueError:
                unknown = self.finish_reason
                self.finish_reason = FinishReason.ERROR
                if self.error is None:
                    self.error = ErrorInfo(
                        ErrorCode.INTERNAL, f"the worker ended the request with finish reason {unknown!r}, unknown to this "
                        "gateway; run the same barrel-inference version on both sides",
                    )  # fmt: skip


class Tick(msgspec.Struct, tag="tick", tag_field="kind", omit_defaults=True):
    """Everything that advanced for one gateway during one scheduler tick.

    Accepted come first, then deltas, then dones: a request's acceptance, first output and end can share a tick.
    """

    accepted: list[Accepted] = []
    deltas: list[Delta] = []
    done: list[Done] = []


# ---- helper replies ---------------------------------------------------------------------


class Reply(msgspec.Struct, tag_field="kind", omit_defaults=True, kw_only=True):
    """What every helper reply has: the call's id and, when it failed, a typed error."""

    id: str
    error: ErrorInfo | None = None


class TokenizeResult(Reply, tag="tokenize_result", kw_only=True):
    tokens: list[int] = []


class DetokenizeResult(Reply, tag="detokenize_result", kw_only=True):
    text: str = ""


class RenderResult(Reply, tag="render_result", kw_only=True):
    text: str = ""


class CountResult(Reply, tag="count_result", kw_only=True):
    count: int = 0


class StatsResult(Reply, tag="stats_result", kw_only=True):
    stats: dict = {}


class EmbedResult(Reply, tag="embed_result", kw_only=True):
    embeddings: list[list[float]] = []
    count: int = 0  # tokens read


HelperReply = Union[TokenizeResult, DetokenizeResult, RenderResult, CountResult, StatsResult, EmbedResult]
REPLY_OF: dict[type, type] = {
    Tokenize: TokenizeResult, Detokenize: DetokenizeResult, Render: RenderResult, CountTokens: CountResult,
    GetStats: StatsResult, Embed: EmbedResult,
}  # fmt: skip


class Pong(msgspec.Struct, tag="pong", tag_field="kind"):
    nonce: int = 0
    running: int = 0
    waiting: int = 0


FromWorker = Union[Hello, Tick, TokenizeResult, DetokenizeResult, RenderResult, CountResult, StatsResult, EmbedResult, Pong]
