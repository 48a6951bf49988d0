"""An Ollama model template (a Modelfile's TEMPLATE) rendered as Ollama renders it.

What the template sees is Ollama's: messages collated (consecutive messages of one role joined with a
blank line, tool messages kept apart; every system message's content also joined into `.System`),
each a struct with `.Role`, `.Content`, `.Thinking`, `.Images`, `.ToolCalls` (each with
`.Function.Name`, `.Function.Arguments`, printed as JSON), `.ToolName`, `.ToolCallID`; `.Tools`
(each with `.Type`, `.Function.Name`, `.Function.Description`, `.Function.Parameters`, printed as
JSON), `.Response` (empty: the reply is what comes next), `.Think`, `.IsThinkSet`, `.ThinkLevel`.

A template that mentions `.Messages` is run once over the whole conversation. Any other (the older
kind, with `.System`, `.Prompt`, `.Response`) is run once per user turn with its assistant reply,
and for the last turn only up to its `{{ .Response }}`, so the prompt ends where the reply starts;
a template with neither `.Messages` nor `.Response` gets `{{ .Response }}` appended, as Ollama does.
"""

from __future__ import annotations

from typing import Any

from .exec import MAX_OUTPUT, MAX_STEPS, NAMES, Run, Struct, cut_after_response
from .parse import Action, Command, Field, GoTemplateError, Pipe, identifiers, parse

__all__ = ["OllamaTemplate", "GoTemplateError", "check"]


def check(source: str) -> None:
    """Raise GoTemplateError (naming the construct and line) for a template this renderer cannot run."""
    OllamaTemplate(source)


class OllamaTemplate:
    def __init__(self, source: str, *, max_steps: int = MAX_STEPS, max_output: int = MAX_OUTPUT) -> None:
        self.source = source
        self.max_steps = max_steps
        self.max_output = max_output
        nodes = parse(source, NAMES)
        names = identifiers(nodes)
        if "messages" not in names and "response" not in names:
            nodes = nodes + [Action(Pipe([Command([Field(["Response"])])]))]
        self.nodes = nodes
        self.whole = "messages" in names or "document" in names

    def _run(self, nodes: list, data: dict, out: list[str]) -> None:
        run = Run(data, max_steps=self.max_steps, max_output=self.max_output - sum(map(len, out)))
        run.nodes(nodes, data)
        out.append("".join(run.out))

    def render(self, messages: list[dict], tools: list[dict] | None = None, *, think: bool | None = None,
               think_level: str = "") -> str:  # fmt: skip
        """messages: {role, content, thinking?, tool_calls?: [{id?, name, arguments: dict}], tool_name?,
        tool_call_id?}; tools: OpenAI-shaped function tools; think: the request's thinking switch (None: unset)."""
        system, collated = collate(messages)
        flags = {"Think": bool(think), "IsThinkSet": think is not None, "ThinkLevel": think_level or ""}
        out: list[str] = []
        if self.whole:
            data = {"System": system, "Messages": [message_struct(m) for m in collated],
                    "Tools": [tool_struct(t) for t in tools or []], "Response": "", **flags}  # fmt: skip
            self._run(self.nodes, data, out)
            return "".join(out)
        system, prompt, response = "", "", ""
        for m in collated:
            role = m.get("role")
            if role == "system":
                if prompt or response:
                    self._run(self.nodes, {"System": system, "Prompt": prompt, "Response": response, **flags}, out)
                    system = prompt = response = ""
                system = m.get("content") or ""
            elif role == "user":
                if response:
                    self._run(self.nodes, {"System": system, "Prompt": prompt, "Response": response, **flags}, out)
                    system = prompt = response = ""
                prompt = m.get("content") or ""
            elif role == "assistant":
                response = m.get("content") or ""
        self._run(cut_after_response(self.nodes), {"System": system, "Prompt": prompt, "Response": response, **flags}, out)
        return "".join(out)


def collate(messages: list[dict]) -> tuple[str, list[dict]]:
    systems: list[str] = []
    out: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            systems.append(m.get("content") or "")
        if out and out[-1].get("role") == role and role != "tool":
            out[-1] = {**out[-1], "content": (out[-1].get("content") or "") + "\n\n" + (m.get("content") or "")}
        else:
            out.append(dict(m))
    return "\n\n".join(systems), out


def message_struct(m: dict) -> Struct:
    calls = [call_struct(c, i) for i, c in enumerate(m.get("tool_calls") or [])]
    fields = {
        "Role": m.get("role") or "", "Content": m.get("content") or "", "Thinking": m.get("thinking") or "", "Images": [],
        "ToolCalls": calls, "ToolName": m.get("tool_name") or "", "ToolCallID": m.get("tool_call_id") or "",
    }  # fmt: skip
    js: dict[str, Any] = {"role": fields["Role"], "content": fields["Content"]}
    if fields["Thinking"]:
        js["thinking"] = fields["Thinking"]
    if calls:
        js["tool_calls"] = [c.json for c in calls]
    if fields["ToolName"]:
        js["tool_name"] = fields["ToolName"]
    return Struct("api.Message", fields, js)


def call_struct(c: dict, index: int) -> Struct:
    args = c.get("arguments")
    args = args if isinstance(args, dict) else {}
    fn_js = {"index": index, "name": c.get("name") or "", "arguments": args}
    fn = Struct("api.ToolCallFunction", {"Index": index, "Name": c.get("name") or "", "Arguments": args}, fn_js)
    js = {**({"id": c["id"]} if c.get("id") else {}), "function": fn_js}
    return Struct("api.ToolCall", {"ID": c.get("id") or "", "Function": fn}, js)


def tool_struct(t: dict) -> Struct:
    fn = t.get("function") if isinstance(t.get("function"), dict) else {}
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    prop_structs = {
        name: Struct("api.ToolProperty", {"Type": p.get("type"), "Items": p.get("items"), "Description": p.get("description") or "",
                                          "Enum": p.get("enum") or []}, p)  # fmt: skip
        for name, p in props.items() if isinstance(p, dict)
    }
    param_struct = Struct("api.ToolFunctionParameters", {
        "Type": params.get("type") or "", "Defs": params.get("$defs"), "Items": params.get("items"),
        "Required": list(params.get("required") or []), "Properties": prop_structs,
    }, params)  # fmt: skip
    fn_struct = Struct("api.ToolFunction", {"Name": fn.get("name") or "", "Description": fn.get("description") or "",
                                            "Parameters": param_struct}, fn)  # fmt: skip
    return Struct("api.Tool", {"Type": t.get("type") or "function", "Items": None, "Function": fn_struct}, t)
