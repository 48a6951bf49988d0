"""Schema algebra for the JSON-Schema converter: type tests, numeric bounds, merging allOf branches,
spotting contradictions and disjoint alternatives. Pure Python."""

from __future__ import annotations

import json
import math
from typing import Any

from .grammar import GrammarRefused

_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "discriminator", "$anchor", "nullable", "strict", "name",
}  # fmt: skip


def _is_type(v: Any, t: Any) -> bool:
    types = t if isinstance(t, list) else [t]
    for one in types:
        if (one == "string" and isinstance(v, str)) or (one == "boolean" and isinstance(v, bool)) or (one == "null" and v is None):
            return True
        if one == "integer" and isinstance(v, int) and not isinstance(v, bool):
            return True
        if one == "integer" and isinstance(v, float) and v.is_integer():
            return True
        if one == "number" and isinstance(v, (int, float)) and not isinstance(v, bool):
            return True
        if one == "object" and isinstance(v, dict):
            return True
        if one == "array" and isinstance(v, list):
            return True
    return False


def _implied_type(s: dict) -> str | None:
    if any(k in s for k in ("properties", "required", "additionalProperties", "patternProperties")):
        return "object"
    if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
        return "array"
    if any(k in s for k in ("minLength", "maxLength", "pattern")):
        return "string"
    return None


def _int(v: Any, kw: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or not float(v).is_integer():
        raise GrammarRefused(f"{kw} must be a non-negative integer", kw, 0)
    return int(v)


def _whole(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer()


def _num(v: Any, kw: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise GrammarRefused(f"{kw} must be a number", kw, 0)
    return v


def _bounds(s: dict, integer: bool) -> tuple:
    """(lo, hi) inclusive; for integers the whole numbers in range (exclusive bounds either form)."""
    lo = hi = None
    if "minimum" in s:
        m = _num(s["minimum"], "minimum")
        if s.get("exclusiveMinimum") is True:  # draft 4
            lo = math.floor(m) + 1 if integer else m
        else:
            lo = math.ceil(m) if integer else m
    if "maximum" in s:
        m = _num(s["maximum"], "maximum")
        if s.get("exclusiveMaximum") is True:
            hi = math.ceil(m) - 1 if integer else m
        else:
            hi = math.floor(m) if integer else m
    em, eM = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if em is not None and not isinstance(em, bool):
        v = _num(em, "exclusiveMinimum")
        v = math.floor(v) + 1 if integer else v
        lo = v if lo is None else max(lo, v)
    if eM is not None and not isinstance(eM, bool):
        v = _num(eM, "exclusiveMaximum")
        v = math.ceil(v) - 1 if integer else v
        hi = v if hi is None else min(hi, v)
    if integer:
        lo = None if lo is None else int(lo)
        hi = None if hi is None else int(hi)
    return lo, hi


_MAX_KW = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"}
_MIN_KW = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"}


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if k in _ANNOTATIONS:
            continue
        if k not in out:
            out[k] = v
        elif out[k] == v:
            continue
        elif k in _MAX_KW and not isinstance(v, bool) and not isinstance(out[k], bool):
            out[k] = max(out[k], v)
        elif k in _MIN_KW and not isinstance(v, bool) and not isinstance(out[k], bool):
            out[k] = min(out[k], v)
        elif k == "required":
            out[k] = list(dict.fromkeys(list(out[k]) + list(v)))
        elif k == "properties":
            props = dict(out[k])
            for name, sub in v.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[k] = props
        elif k == "type":
            ta = set(out[k] if isinstance(out[k], list) else [out[k]])
            tb = set(v if isinstance(v, list) else [v])
            both = ta & tb
            if "number" in ta and "integer" in tb:
                both.add("integer")
            if "integer" in ta and "number" in tb:
                both.add("integer")
            if not both:
                out[k] = []  # contradiction
            else:
                out[k] = sorted(both) if len(both) > 1 else both.pop()
        elif k == "enum":
            out[k] = [x for x in out[k] if x in v]
        elif k == "additionalProperties" and (v is False or out[k] is False):
            out[k] = False
        else:
            out.setdefault("allOf", [])
            out["allOf"] = list(out["allOf"]) + [{k: v}]
    return out


def _contradicts(s: dict) -> bool:
    if s.get("type") == []:
        return True
    if "enum" in s and not s["enum"]:
        return True
    if "const" in s and "enum" in s and s["const"] not in s["enum"]:
        return True
    for lo, hi in (("minimum", "maximum"), ("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")):
        a, b = s.get(lo), s.get(hi)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool) and a > b:
            return True
    return False


def _disjoint(options: list) -> bool:
    """Alternatives no value can satisfy two of: distinct primitive types, or distinct consts of one
    required property (a discriminated union)."""
    types = []
    for o in options:
        if not isinstance(o, dict):
            return False
        t = o.get("type")
        if not isinstance(t, str) or t in ("object",) and len(options) > 1:
            types = None
            break
        types.append("number" if t == "integer" else t)
    if types is not None and len(set(types)) == len(types):
        return True
    for key in (options[0].get("properties") or {}) if isinstance(options[0], dict) else {}:
        seen = set()
        for o in options:
            p = (o.get("properties") or {}).get(key) if isinstance(o, dict) else None
            if not isinstance(p, dict) or key not in (o.get("required") or []):
                break
            v = p.get("const", p["enum"][0] if isinstance(p.get("enum"), list) and len(p["enum"]) == 1 else None)
            if v is None or json.dumps(v) in seen:
                break
            seen.add(json.dumps(v))
        else:
            return True
    return False
