"""POST /api/create (a Modelfile, or the newer JSON fields) and POST /api/edit (ours: merge into a manifest).

A created model is a new manifest that points at its base's GGUF blob (no copy: the tag shares the blob)
with its own PARAMETERs, SYSTEM, MESSAGEs, TEMPLATE and LICENSE. Everything is checked before anything is
written, so a bad parameter is a 400 naming it and nothing changes; the progress statuses are then streamed
as Ollama streams them. A TEMPLATE (Go text/template) is parsed here: one the renderer cannot run is a 400
naming the construct; the model's worker then renders its prompts with it (gotemplate).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...gotemplate import GoTemplateError, check as check_template
from ...registry import RegistryError
from ...registry.layout import bare_hex
from ...registry.names import normalize
from ..http import JSONBody
from . import convert, wire
from .management import BadRequest, decode, handles_errors, ndjson, require_model
from .modelfile import ModelfileError, parameter_value, parse


def _typed_parameters(params: dict | None, where: str = "parameters") -> dict:
    out: dict[str, Any] = {}
    for name, value in (params or {}).items():
        if value is None:
            continue
        try:
            typed = parameter_value(name, value, where)
        except ModelfileError as exc:
            raise BadRequest(str(exc)) from None
        out[name] = typed
    return out


def _messages(items: list | None) -> list[dict]:
    out = []
    for i, m in enumerate(items or []):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}] needs a role of system, user, assistant or tool")
        out.append({"role": m["role"], "content": str(m.get("content") or "")})
    return out


def _checked_template(template: str) -> str:
    try:
        check_template(template)
    except GoTemplateError as exc:
        raise BadRequest(f"TEMPLATE: {exc}") from None
    return template


def _layer(kind: str, value: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps({kind: value}, sort_keys=True).encode()).hexdigest()


def _base_data(registry: Any, source: str) -> dict:
    """The manifest to build on: a registered model, or a GGUF file on this machine (registered as a path)."""
    path = Path(source).expanduser()
    if path.is_absolute():
        if not path.is_file():
            raise BadRequest(f"FROM {source}: no such file on the server")
        details, loader = registry._scan(source, path)
        return {
            "schema_version": 1, "source": {"kind": "file", "spec": path.resolve().as_uri()}, "path": str(path.resolve()),
            "size": path.stat().st_size, "details": details, "loader": loader, "parameters": {},
        }  # fmt: skip
    try:
        return registry.manifest_data(source)
    except RegistryError as exc:
        if exc.code == "model_not_found":
            raise RegistryError("model_not_found", f"model '{source}' not found, try pulling it first") from None
        raise


@handles_errors
async def create(request: Request) -> Response:
    req = await decode(request, wire.CreateRequest)
    name = require_model(req)
    try:
        name = normalize(name)
    except RegistryError as exc:
        raise BadRequest(exc.message) from None
    if req.path and not req.modelfile:
        raise BadRequest("'path' (a Modelfile on the server) is not supported; send the Modelfile text in 'modelfile' or the fields 'from', 'parameters', 'system', 'template', 'messages'")
    if req.files:
        raise BadRequest("'files' (uploaded blobs) is not supported; FROM an existing model or an absolute GGUF path on the server")
    if req.adapters:
        raise BadRequest("'adapters' (LoRA) is not supported by this server")
    if req.quantize:
        raise BadRequest("'quantize' is not supported by this server; pull a quantized GGUF instead")
    try:
        mf = parse(req.modelfile) if req.modelfile else None
    except ModelfileError as exc:
        raise BadRequest(f"Modelfile: {exc}") from None
    if mf is not None and mf.adapters:
        raise BadRequest("Modelfile: ADAPTER (LoRA) is not supported by this server")
    source = req.from_ or (mf.from_ if mf else None)
    if not source:
        raise BadRequest("'from' is required: the name of a model to build on, or an absolute GGUF path on the server")
    params = dict(mf.parameters) if mf else {}
    params.update(_typed_parameters(req.parameters))
    template = req.template if req.template is not None else (mf.template if mf else None)
    if template is not None:
        _checked_template(template)
    system = req.system if req.system is not None else (mf.system if mf else None)
    messages = _messages(req.messages) if req.messages is not None else (mf.messages if mf else [])
    license_ = ([req.license] if isinstance(req.license, str) else list(req.license)) if req.license is not None else (mf.license if mf else [])

    registry = request.app.state.registry
    base = await asyncio.to_thread(_base_data, registry, source)
    data = dict(base)
    data["parameters"] = {**(base.get("parameters") or {}), **params}
    if template is not None:
        data["template"], data["template_format"] = template, "go"
    if system is not None:
        data["system"] = system
    if messages:
        data["messages"] = messages
    if license_:
        data["license"] = license_
    data["parent"] = source
    record = await asyncio.to_thread(registry.write_data, name, data)

    statuses = [{"status": "reading model metadata"}]
    blob = (data.get("blob") or {}).get("digest")
    if blob:
        statuses.append({"status": f"using existing layer sha256:{bare_hex(blob)}"})
    for kind, value in (("template", template), ("system", system), ("params", params or None), ("messages", messages or None), ("license", license_ or None)):
        if value is not None:
            statuses.append({"status": f"creating new layer {_layer(kind, value)}"})
    statuses += [{"status": "writing manifest"}, {"status": "success"}]
    request.app.state.log.info("model_created", model=record.name, base=source, parameters=sorted(params))
    if not req.stream:
        return JSONBody({"status": "success"})

    async def events():
        for s in statuses:
            yield s

    return ndjson(events())


@handles_errors
async def edit(request: Request) -> Response:
    """POST /api/edit: parameters merged key by key into the manifest (null removes one); template, system,
    messages replaced when given. Written atomically; answered in the /api/show shape."""
    req = await decode(request, wire.EditRequest)
    name = require_model(req)
    registry = request.app.state.registry
    data = await asyncio.to_thread(registry.manifest_data, name)
    params = dict(data.get("parameters") or {})
    for key, value in (req.parameters or {}).items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = _typed_parameters({key: value})[key]
    data["parameters"] = params
    if req.template is not None:
        data["template"], data["template_format"] = _checked_template(req.template), "go"
    if req.system is not None:
        data["system"] = req.system
    if req.messages is not None:
        data["messages"] = _messages(req.messages)
    record = await asyncio.to_thread(registry.write_data, data["name"], data)
    request.app.state.log.info("model_edited", model=record.name, parameters=sorted(req.parameters or {}))
    return JSONBody(convert.show_body(record))
