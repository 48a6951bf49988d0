"""msgspec Structs for the link. Two tagged unions: ToWorker (gateway -> worker) and FromWorker.

Rules: every new field gets a default (old peers keep decoding); bump PROTOCOL_VERSION on a
change that an old peer cannot ignore.
"""

from __future__ import annotations

import enum
from typing import Union

import msgspec

PROTOCOL_VERSION = 1

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
    "Call",
    "Ping",
    "Hello",
    "EngineInfo",
    "Delta",
    "Usage",
    "Timings",
    "Done",
    "Tick",
    "CallResult",
    "Pong",
    "ToWorker",
    "FromWorker",
    "CALL_OPS",
]


class ErrorCode(str, enum.Enum):
    """Typed error codes. Each API family maps them to its own error body and status."""

    INVALID_REQUEST = "invalid_request"  # a field the engine cannot accept
    CONTEXT_LENGTH = "context_length_exceeded"  # prompt (+ max tokens) longer than the context
    MODEL_NOT_FOUND = "model_not_found"
    GRAMMAR = "grammar_error"  # the grammar did not parse
    TEMPLATE = "template_error"  # the chat template failed to render
    OVERLOADED = "overloaded"  # admission queue full
    WORKER_UNAVAILABLE = "worker_unavailable"  # the worker died or could not start
    DECODE_FAILED = "decode_failed"  # llama_decode failed; the context was recreated
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS / end-of-generation token or a stop sequence
    LENGTH = "length"  # max tokens or the context filled up
    ABORT = "abort"  # cancelled by the gateway (client disconnect, unload)
    ERROR = "error"  # see Done.error


class ErrorInfo(msgspec.Struct, omit_defaults=True):
    code: ErrorCode
    message: str
    retryable: bool = False
    param: str | None = None  # the offending field, where there is one


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
    add_generation_prompt: bool = True
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    stop: list[str] = []
    max_tokens: int | None = None  # None: until EOS or the context is full
    grammar: str | None = None  # GBNF
    json_schema: dict | None = None  # constrain output to JSON matching this schema ({} = any JSON object)
    session: str | None = None
    ignore_eos: bool = False
    want_tokens: bool = False  # carry token ids in deltas


class Abort(msgspec.Struct, tag="abort", tag_field="kind"):
    """Cancel requests; idempotent. Each still running ends with Done(abort)."""

    ids: list[str]


class EndSession(msgspec.Struct, tag="end_session", tag_field="kind"):
    session: str


CALL_OPS = ("tokenize", "detokenize", "render", "count_tokens", "stats", "embed")


class Call(msgspec.Struct, tag="call", tag_field="kind", omit_defaults=True):
    """A synchronous helper call. op is one of CALL_OPS.

    tokenize: text (+add_special, parse_special) -> tokens
    detokenize: tokens -> text
    render: messages (+tools, add_generation_prompt) -> text
    count_tokens: text or messages -> count
    stats: -> stats
    embed: texts -> embeddings (L2-normalised, mean-pooled) and count (tokens read)
    """

    id: str
    op: str
    text: str | None = None
    texts: list[str] | None = None
    tokens: list[int] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    add_special: bool = True
    parse_special: bool = True


class Ping(msgspec.Struct, tag="ping", tag_field="kind"):
    nonce: int = 0


ToWorker = Union[Connect, Submit, Abort, EndSession, Call, Ping]


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


class Delta(msgspec.Struct, omit_defaults=True):
    """New output of one request since the last tick."""

    id: str
    text: str = ""
    tokens: list[int] = []
    n_tokens: int = 0  # tokens generated this tick (text may lag behind tokens)


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Timings(msgspec.Struct):
    """Milliseconds. queue: submit -> first prefill chunk; prefill: -> first token; decode: the rest."""

    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


class Done(msgspec.Struct, omit_defaults=True):
    id: str
    finish_reason: FinishReason
    stop_sequence: str | None = None
    usage: Usage = msgspec.field(default_factory=Usage)
    timings: Timings = msgspec.field(default_factory=Timings)
    error: ErrorInfo | None = None


class Tick(msgspec.Struct, tag="tick", tag_field="kind", omit_defaults=True):
    """Everything that advanced for one gateway during one scheduler tick.

    Deltas come before dones: a request's last delta and its done can share a tick.
    """

    deltas: list[Delta] = []
    done: list[Done] = []


class CallResult(msgspec.Struct, tag="call_result", tag_field="kind", omit_defaults=True):
    id: str
    tokens: list[int] | None = None
    text: str | None = None
    count: int | None = None
    stats: dict | None = None
    error: ErrorInfo | None = None
    embeddings: list[list[float]] | None = None


class Pong(msgspec.Struct, tag="pong", tag_field="kind"):
    nonce: int = 0
    running: int = 0
    waiting: int = 0


FromWorker = Union[Hello, Tick, CallResult, Pong]
