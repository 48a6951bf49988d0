"""`run` (one streamed answer, or an interactive session like `ollama run`) and `embed`.

A model whose source has no chat template of its own runs as a text completion (POST /v1/completions):
the architecture's built-in chat template would only confuse a base model.
"""

from __future__ import annotations

import sys
import time

import click

from ..config import load_settings
from .client import CLIError
from .context import State, json_option
from .formatting import echo_json
from .names import model_hint


def default_num_predict() -> int:
    """`run_num_predict` from the configuration (a cap for answers; 0 or less means none)."""
    try:
        return load_settings().run_num_predict
    except (OSError, ValueError):
        from ..config import Settings

        return Settings().run_num_predict


# Ollama's parameter names (as `/set parameter` takes them) -> the OpenAI request fields
PARAMETERS = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "seed": ("seed", int),
    "num_predict": ("max_tokens", int),
    "repeat_penalty": ("repeat_penalty", float),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "stop": ("stop", str),
}


def parse_parameter(name: str, value: str):
    """Check one `/set parameter NAME VALUE`; returns the typed value or raises CLIError."""
    if name not in PARAMETERS:
        raise CLIError(f"unknown parameter '{name}'; known: {', '.join(sorted(PARAMETERS))}")
    kind = PARAMETERS[name][1]
    try:
        return kind(value)
    except ValueError:
        raise CLIError(f"parameter '{name}' takes {'an integer' if kind is int else 'a number'}, not {value!r}") from None


class Session:
    """One model, its mode (chat or text completion), system prompt, parameters and conversation."""

    def __init__(self, state: State, name: str, *, system: str | None = None, params: dict | None = None, verbose: bool = False):
        self.state = state
        self.name = name
        self.system = system
        self.params: dict = dict(params or {})
        self.messages: list[dict] = []
        self.verbose = verbose
        self.info: dict = {}
        self.chat = True
        self._said_completion = False

    # ---- the model -------------------------------------------------------------------------------
    def load(self, name: str | None = None) -> None:
        """Look the model up (a did-you-mean when it does not exist) and choose chat or completion."""
        name = name or self.name
        try:
            info = self.state.client().call("POST", "/api/show", {"model": name}) or {}
        except CLIError as exc:
            raise model_hint(self.state, exc, name) from None
        self.name, self.info = name, info
        self.chat = has_chat_template(info)
        self.messages = []
        if not self.chat and not self._said_completion:
            self._said_completion = True
            click.echo(f"note: {name} has no chat template; running it as a text completion (the prompt is continued)", err=True)

    # ---- requests --------------------------------------------------------------------------------
    def body(self, prompt: str, stream: bool) -> tuple[str, dict]:
        body: dict = {"model": self.name, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        for key, value in self.params.items():
            if key in PARAMETERS and value is not None:
                field = PARAMETERS[key][0]
                if field == "max_tokens" and value <= 0:
                    if not self.chat:  # /v1/completions caps at 16 tokens unless told; no cap: the context's size
                        body["max_tokens"] = (self.info.get("loader") or {}).get("n_ctx") or 2**30
                    continue
                body[field] = value
        if self.chat:
            system = [{"role": "system", "content": self.system}] if self.system else []
            body["messages"] = [*system, *self.messages, {"role": "user", "content": prompt}]
            return "/v1/chat/completions", body
        body["prompt"] = (self.system + "\n\n" + prompt) if self.system else prompt
        return "/v1/completions", body

    def ask(self, prompt: str) -> str:
        """Stream one answer to stdout (thinking to stderr); keep the turn in the conversation."""
        path, body = self.body(prompt, True)
        out: list[str] = []
        usage: dict = {}
        thinking = False
        t0 = time.monotonic()
        t_first = None
        try:
            for chunk in self.state.client(timeout=600).sse(path, body):
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if reasoning:
                        thinking = True
                        click.echo(click.style(reasoning, dim=True) if sys.stderr.isatty() else reasoning, nl=False, err=True)
                    text = delta.get("content") if self.chat else choice.get("text")
                    if text:
                        if t_first is None:
                            t_first = time.monotonic()
                        if thinking:
                            click.echo("", err=True)
                            thinking = False
                        out.append(text)
                        click.echo(text, nl=False)
                        sys.stdout.flush()
        except CLIError as exc:
            raise model_hint(self.state, exc, self.name) from None
        click.echo("")
        answer = "".join(out)
        if self.chat:
            self.messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        if self.verbose:
            click.echo(stats_text(usage, t0, t_first, time.monotonic()), err=True)
        return answer

    def answer_json(self, prompt: str) -> dict:
        path, body = self.body(prompt, False)
        try:
            return self.state.client(timeout=600).call("POST", path, body)
        except CLIError as exc:
            raise model_hint(self.state, exc, self.name) from None


def has_chat_template(info: dict) -> bool:
    """The model's source (or the operator) gave it a chat template; a built-in one chosen only by architecture
    does not count."""
    if "chat_template_origin" in info:
        return info["chat_template_origin"] != "architecture"
    if str(info.get("chat_template") or "").startswith("built-in"):
        return False
    return bool(info.get("template") or info.get("chat_template"))


def stats_text(usage: dict, t0: float, t_first: float | None, t_end: float) -> str:
    """Ollama's --verbose figures, measured here: counts from the answer's usage, times on this clock."""
    prompt = usage.get("prompt_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    evals = usage.get("completion_tokens")
    first = (t_first or t_end) - t0
    decode = t_end - (t_first or t_end)
    lines = [
        f"total duration:       {t_end - t0:.3f}s",
        f"prompt eval count:    {prompt if prompt is not None else '?'} token(s)" + (f" ({cached} cached)" if cached else ""),
        f"prompt eval duration: {first:.3f}s (time to first token)",
    ]
    if prompt and first > 0:
        lines.append(f"prompt eval rate:     {prompt / first:.2f} tokens/s")
    lines.append(f"eval count:           {evals if evals is not None else '?'} token(s)")
    lines.append(f"eval duration:        {decode:.3f}s")
    if evals and evals > 1 and decode > 0:
        lines.append(f"eval rate:            {(evals - 1) / decode:.2f} tokens/s")
    return "\n".join(lines)


@click.command()
@click.argument("name", shell_complete=lambda ctx, param, incomplete: complete_models(ctx, incomplete))
@click.argument("prompt", nargs=-1)
@click.option("--system", help="A system prompt.")
@click.option("--temperature", type=float)
@click.option("--max-tokens", type=int, help="Cap each answer (default: run_num_predict from the configuration; 0 = no cap).")
@click.option("--seed", type=int)
@click.option("--verbose", is_flag=True, help="After each answer print prompt and eval counts, durations and rates.")
@click.option("-i", "--interactive", is_flag=True, help="Chat line by line even when stdin is not a terminal.")
@json_option
@click.pass_obj
def run(state: State, name: str, prompt: tuple[str, ...], system, temperature, max_tokens, seed, verbose, interactive):
    """Run a model: one answer to PROMPT, or (without PROMPT, on a terminal) an interactive session.

    Text piped on stdin comes before PROMPT (`cat notes.txt | bictl run MODEL "Summarize:"`). In the session,
    /? lists the commands; Ctrl-C stops an answer, Ctrl-D or /bye leaves.
    """
    params = {"temperature": temperature, "seed": seed, "num_predict": max_tokens if max_tokens is not None else default_num_predict()}
    session = Session(state, name, system=system, params={k: v for k, v in params.items() if v is not None}, verbose=verbose)
    text = " ".join(prompt)
    if not interactive and not sys.stdin.isatty():
        piped = sys.stdin.read().strip()
        text = f"{piped}\n\n{text}" if piped and text else piped or text
        if not text:
            raise CLIError("no prompt: give one as arguments or on stdin")
    session.load()
    if text:
        if state.json:
            echo_json(session.answer_json(text))
            return
        session.ask(text)
        return
    from .repl import repl

    repl(session)


def complete_models(ctx: click.Context, incomplete: str):
    """Shell completion of model names (asks the daemon; nothing when none answers)."""
    from click.shell_completion import CompletionItem

    root = ctx.find_root()
    state = root.obj if isinstance(root.obj, State) else State(host=root.params.get("host"))
    try:
        models = state.client(timeout=2).call("GET", "/api/tags")["models"]
    except (CLIError, KeyError, TypeError):
        return []
    return [CompletionItem(m["name"]) for m in models if m["name"].startswith(incomplete)]


@click.command()
@click.argument("name", shell_complete=lambda ctx, param, incomplete: complete_models(ctx, incomplete))
@click.argument("texts", nargs=-1, required=True)
@json_option
@click.pass_obj
def embed(state: State, name: str, texts: tuple[str, ...]):
    """Embed TEXTS with a model (POST /v1/embeddings)."""
    try:
        res = state.client(timeout=300).call("POST", "/v1/embeddings", {"model": name, "input": list(texts)})
    except CLIError as exc:
        if exc.status in (404, 405, 501) and "model" not in exc.message.lower():
            raise CLIError(f"the daemon at {state.url} cannot embed: POST /v1/embeddings answered {exc.status} ({exc.message})") from None
        raise model_hint(state, exc, name) from None
    if state.json:
        echo_json(res)
        return
    for item, text in zip(res.get("data") or [], texts):
        vec = item.get("embedding") or []
        head = ", ".join(f"{x:.4f}" for x in vec[:6])
        click.echo(f"{text[:40]!r}: dim={len(vec)} [{head}{', …' if len(vec) > 6 else ''}]")
