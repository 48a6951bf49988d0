"""Model commands: pull, list, ps, show, rm, copy (cp), create, search, unload / stop MODEL."""

from __future__ import annotations

import json

import click

from .client import CLIError
from .context import State, json_option
from .formatting import PullProgress, ago, echo_json, human_size, processor, table, until
from .names import model_hint

MODEL_ARG = {"shell_complete": lambda ctx, param, incomplete: _complete(ctx, incomplete)}


def _complete(ctx, incomplete):
    from .chat import complete_models

    return complete_models(ctx, incomplete)


@click.command()
@click.argument("spec")
@click.option("--name", "name", help="Register under this name instead of the one derived from SPEC.")
@click.option("--sha256", help="Verify the download against this sha256.")
@json_option
@click.pass_obj
def pull(state: State, spec: str, name: str | None, sha256: str | None):
    """Pull a model: NAME[:TAG] or ollama://…, hf://org/repo[/file.gguf][@rev], https://…, file:///… or /abs/path."""
    body = {"model": spec}
    if name:
        body["destination"] = name
    if sha256:
        body["sha256"] = sha256
    events = state.client(timeout=600).ndjson("POST", "/api/pull", body)
    if state.json:
        for ev in events:
            click.echo(json.dumps(ev))
        return
    bar = PullProgress()
    try:
        for ev in events:
            bar.update(ev)
    except KeyboardInterrupt:
        # closing the stream tells the daemon: it cancels the job and removes the partial download
        bar.finish_layer()
        raise CLIError(f"pull of {spec} cancelled", exit_code=130) from None
    finally:
        bar.finish_layer()


@click.command("list")
@json_option
@click.pass_obj
def list_models(state: State):
    """List the models on disk (NAME ID SIZE MODIFIED)."""
    models = state.client().call("GET", "/api/tags")["models"]
    if state.json:
        echo_json(models)
        return
    rows = [[m["name"], (m.get("digest") or "")[:12] or "?", human_size(m.get("size")), ago(m.get("modified_at"))] for m in models]
    click.echo(table(["NAME", "ID", "SIZE", "MODIFIED"], rows))


@click.command()
@json_option
@click.pass_obj
def ps(state: State):
    """List the models loaded in the daemon."""
    models = state.client().call("GET", "/api/ps")["models"]
    if state.json:
        echo_json(models)
        return
    rows = [[m["name"], (m.get("digest") or "")[:12] or "?", human_size(m.get("size")), processor(m.get("size"), m.get("size_vram")),
             str(m.get("context_length") or "?"), str(m.get("n_seq_max") or "?"),
             str(m.get("in_flight") if m.get("in_flight") is not None else "?"), str(m.get("pid") or "remote"), until(m.get("expires_at"))]
            for m in models]  # fmt: skip
    click.echo(table(["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "SEQS", "IN FLIGHT", "PID", "UNTIL"], rows))
    several = [m for m in models if len(m.get("replicas") or []) > 1]
    if several:  # models with replicas: one line each
        rows = [[m["name"], str(r.get("replica")), "up" if r.get("alive") else "starting", str(r.get("pid") or "remote"),
                 r.get("device") or "-", str(r.get("in_flight", 0)), routed_text(r.get("routed") or {}),
                 cached_text(r.get("prompt_tokens", 0), r.get("cached_tokens", 0))]
                for m in several for r in m["replicas"]]  # fmt: skip
        click.echo("")
        click.echo(table(["NAME", "REPLICA", "STATE", "PID", "DEVICE", "IN FLIGHT", "ROUTED", "CACHED"], rows))


def routed_text(routed: dict) -> str:
    """{"affinity": 3, "least_loaded": 1} -> 'affinity 3, least_loaded 1'."""
    return ", ".join(f"{k} {v}" for k, v in sorted(routed.items())) or "-"


def cached_text(prompt: int, cached: int) -> str:
    """Share of prompt tokens served from the replica's cache."""
    return f"{100.0 * cached / prompt:.0f}%" if prompt else "-"


@click.command()
@click.argument("name", **MODEL_ARG)
@click.option("--modelfile", is_flag=True, help="Print the Modelfile.")
@click.option("--template", is_flag=True, help="Print the chat template.")
@click.option("--parameters", is_flag=True, help="Print the parameters.")
@json_option
@click.pass_obj
def show(state: State, name: str, modelfile: bool, template: bool, parameters: bool):
    """Show a model's details, loader settings and source."""
    try:
        info = state.client().call("POST", "/api/show", {"model": name})
    except CLIError as exc:
        raise model_hint(state, exc, name) from None
    if state.json:
        echo_json(info)
        return
    if modelfile or template or parameters:
        for flag, key in ((modelfile, "modelfile"), (template, "template"), (parameters, "parameters")):
            if flag:
                click.echo(info.get(key) or "")
        return
    d = info.get("details") or {}
    loader = info.get("loader") or {}
    mi = info.get("model_info") or {}
    ctx_len = next((v for k, v in mi.items() if k.endswith(".context_length")), None)
    src = info.get("source") or {}
    lines = [
        ("Model", ""),
        ("  architecture", d.get("family")),
        ("  parameters", d.get("parameter_size")),
        ("  quantization", d.get("quantization_level")),
        ("  context length", ctx_len),
        ("  capabilities", ", ".join(info.get("capabilities") or [])),
        ("Loader", ""),
        ("  n_ctx", loader.get("n_ctx")),
        ("  n_batch", loader.get("n_batch")),
        ("  n_seq_max", loader.get("n_seq_max") or "settings default"),
        ("  tool format", loader.get("tool_format") or "none"),
        ("  thinking", " … ".join(x for x in (loader.get("thinking_start"), loader.get("thinking_end")) if x) or "none"),
        ("Source", ""),
        ("  spec", src.get("spec")),
        ("  kind", src.get("kind")),
    ]
    if info.get("parameters"):
        lines.append(("Parameters", ""))
        lines += [("  " + ln.split(None, 1)[0], ln.split(None, 1)[1] if len(ln.split(None, 1)) > 1 else "") for ln in info["parameters"].splitlines()]
    width = max(len(k) for k, _ in lines) + 3
    for k, v in lines:
        click.echo(k if v == "" else f"{k.ljust(width)}{v if v is not None else '?'}")


@click.command()
@click.argument("names", nargs=-1, required=True, **MODEL_ARG)
@json_option
@click.pass_obj
def rm(state: State, names: tuple[str, ...]):
    """Remove models (and the files no other model uses)."""
    client = state.client()
    done = []
    for name in names:
        try:
            client.call("DELETE", "/api/delete", {"model": name})
        except CLIError as exc:
            raise model_hint(state, exc, name) from None
        done.append(name)
        if not state.json:
            click.echo(f"deleted '{name}'")
    if state.json:
        echo_json({"deleted": done})


@click.command()
@click.argument("source", **MODEL_ARG)
@click.argument("destination")
@json_option
@click.pass_obj
def copy(state: State, source: str, destination: str):
    """Copy a model to another name (the file is shared)."""
    try:
        state.client().call("POST", "/api/copy", {"source": source, "destination": destination})
    except CLIError as exc:
        raise model_hint(state, exc, source) from None
    if state.json:
        echo_json({"source": source, "destination": destination})
    else:
        click.echo(f"copied '{source}' to '{destination}'")


@click.command()
@click.argument("query", nargs=-1, required=True)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@click.option("--source", "sources", multiple=True, type=click.Choice(["hf", "ollama"]), help="Search only these (repeatable).")
@click.option("--filter", "hf_filter", default="gguf", show_default=True, type=click.Choice(["gguf", "safetensors", "any"]), help="HuggingFace file type.")
@click.option("--timeout", default=10.0, show_default=True, type=float, help="Seconds to wait for each source.")
@json_option
@click.pass_obj
def search(state: State, query, limit, sources, hf_filter, timeout):
    """Search HuggingFace and the Ollama library; the ID column is a pull spec."""
    body = {"query": " ".join(query), "limit": limit, "hf_filter": hf_filter, "timeout": timeout}
    if sources:
        body["sources"] = list(sources)
    result = state.client(timeout=timeout + 30).call("POST", "/api/search", body)
    if state.json:
        echo_json(result)
        return
    rows = []
    for h in result["hits"]:
        desc = (h.get("description") or "").replace("\n", " ")
        rows.append([h["id"], f"{h['downloads']:,}" if h.get("downloads") is not None else "?", ago(h.get("last_modified")), desc[:60]])
    if rows:
        click.echo(table(["ID", "DOWNLOADS", "UPDATED", "DESCRIPTION"], rows))
    else:
        click.echo("no models found")
    for source, message in (result.get("errors") or {}).items():
        click.echo(f"warning: {source} search failed: {message}", err=True)


@click.command()
@click.argument("name", **MODEL_ARG)
@json_option
@click.pass_obj
def unload(state: State, name: str):
    """Stop a model's worker (it loads again on the next request); the same as `bictl stop MODEL`."""
    unload_model(state, name)


def unload_model(state: State, name: str) -> None:
    try:
        res = state.client(timeout=60).call("POST", "/api/unload", {"model": name})
    except CLIError as exc:
        raise model_hint(state, exc, name) from None
    if state.json:
        echo_json(res)
    elif res.get("unloaded"):
        click.echo(f"unloaded '{res['model']}'")
    else:
        click.echo(f"'{res['model']}' was not loaded", err=True)


cp = click.Command("cp", callback=copy.callback, params=copy.params, help="An alias of `copy`.")


COMMANDS = [pull, list_models, ps, show, rm, copy, cp, search, unload]
