"""`run` (a streamed chat completion; with no prompt an interactive chat with history) and `embed`."""

from __future__ import annotations

import sys

import click

from .client import CLIError
from .context import State, json_option
from .formatting import echo_json

HELP = """commands: /bye (or Ctrl-D) ends the chat, /clear forgets the conversation, /? shows this help.
Ctrl-C stops an answer."""


def _request(name: str, messages: list[dict], opts: dict, stream: bool) -> dict:
    body = {"model": name, "messages": messages, "stream": stream}
    body.update({k: v for k, v in opts.items() if v is not None})
    return body


def _hint(exc: CLIError, name: str) -> CLIError:
    if exc.status == 404 and "pull" not in exc.message:
        exc.message += f" — pull it first with `bictl pull {name}`"
    return exc


def stream_answer(state: State, name: str, messages: list[dict], opts: dict) -> str:
    """Print the answer as it streams; return its text. Thinking goes to stderr, dimmed on a terminal."""
    out = []
    thinking = False
    try:
        for chunk in state.client(timeout=600).sse("/v1/chat/completions", _request(name, messages, opts, True)):
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    thinking = True
                    click.echo(click.style(reasoning, dim=True) if sys.stderr.isatty() else reasoning, nl=False, err=True)
                text = delta.get("content")
                if text:
                    if thinking:
                        click.echo("", err=True)
                        thinking = False
                    out.append(text)
                    click.echo(text, nl=False)
                    sys.stdout.flush()
    except CLIError as exc:
        raise _hint(exc, name)
    click.echo("")
    return "".join(out)


@click.command()
@click.argument("name")
@click.argument("prompt", nargs=-1)
@click.option("--system", help="A system prompt.")
@click.option("--temperature", type=float)
@click.option("--max-tokens", type=int)
@click.option("--seed", type=int)
@click.option("-i", "--interactive", is_flag=True, help="Chat line by line even when stdin is not a terminal.")
@json_option
@click.pass_obj
def run(state: State, name: str, prompt: tuple[str, ...], system, temperature, max_tokens, seed, interactive):
    """Chat with a model: one answer to PROMPT, or (without PROMPT, on a terminal) an interactive chat."""
    opts = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed}
    messages = [{"role": "system", "content": system}] if system else []
    text = " ".join(prompt)
    if interactive and not text:
        return chat_loop(state, name, messages, opts)
    if not text and not sys.stdin.isatty():
        text = sys.stdin.read().strip()
        if not text:
            raise CLIError("no prompt: give one as arguments or on stdin")
    if text:
        messages.append({"role": "user", "content": text})
        if state.json:
            try:
                echo_json(state.client(timeout=600).call("POST", "/v1/chat/completions", _request(name, messages, opts, False)))
            except CLIError as exc:
                raise _hint(exc, name)
            return
        stream_answer(state, name, messages, opts)
        return
    chat_loop(state, name, messages, opts)


def chat_loop(state: State, name: str, messages: list[dict], opts: dict) -> None:
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:  # pragma: no cover
        pass
    base = list(messages)
    click.echo(f"chatting with {name} — {HELP}", err=True)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            click.echo("", err=True)
            return
        except KeyboardInterrupt:
            click.echo("", err=True)
            continue
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/bye", "/exit", "/quit"):
            return
        if cmd == "/clear":
            messages[:] = list(base)
            click.echo("(conversation cleared)", err=True)
            continue
        if cmd in ("/?", "/help"):
            click.echo(HELP, err=True)
            continue
        messages.append({"role": "user", "content": line})
        try:
            answer = stream_answer(state, name, messages, opts)
        except KeyboardInterrupt:
            click.echo("\n(stopped)", err=True)
            messages.pop()
            continue
        except CLIError as exc:
            messages.pop()
            if exc.exit_code != 1:
                raise
            click.echo(f"error: {exc.message}", err=True)
            continue
        messages.append({"role": "assistant", "content": answer})


@click.command()
@click.argument("name")
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
        raise _hint(exc, name)
    if state.json:
        echo_json(res)
        return
    for item, text in zip(res.get("data") or [], texts):
        vec = item.get("embedding") or []
        head = ", ".join(f"{x:.4f}" for x in vec[:6])
        click.echo(f"{text[:40]!r}: dim={len(vec)} [{head}{', …' if len(vec) > 6 else ''}]")
