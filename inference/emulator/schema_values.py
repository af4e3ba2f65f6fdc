"""Deterministic values that validate against a JSON schema (function-call arguments).

``value_for_schema(schema, rng)`` returns a JSON-able value valid against ``schema`` or
raises ``Unsatisfiable``.  Honoured: ``type`` (single or list), ``enum``, ``const``,
``default`` (trusted when its JSON type fits), numeric bounds (``minimum``/``maximum`` and both styles of
``exclusiveMinimum``/``exclusiveMaximum``), integer ``multipleOf``, ``minLength``/
``maxLength``, ``minItems``/``maxItems``/``uniqueItems``, ``items``/``prefixItems``,
``properties``/``required``/``additionalProperties``/``minProperties``/``maxProperties``,
``anyOf``/``oneOf`` (first branch that can be satisfied), ``allOf`` (shallow merge) and
local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) as pydantic emits them.

Not honoured: ``pattern``, ``patternProperties``, ``contains``, ``not``, ``if``/``then``,
``dependentRequired``, non-integer ``multipleOf``.  ``oneOf`` is valid when its branches
are disjoint (the usual tagged-union case).  Required properties are always present;
optional ones are included by coin flip.  A ``number`` is a whole number when its bounds
admit one.  Strings come from a small vocabulary chosen by the property name (paths for
``path``/``file``, read-only shell commands for ``command``, ...).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import re
import uuid
from typing import Any

_MAX_DEPTH = 6  # beyond it: no optional properties, arrays at minItems
# A schema demanding more than this many items, characters or properties is treated as
# unsatisfiable: building the value would stall the replica serving everyone else.
_MAX_SIZE = 1000
_GIVE_UP_DEPTH = 24  # a schema that keeps requiring itself is unsatisfiable in practice

WORDS = (
    "alpha",
    "build",
    "cache",
    "config",
    "delta",
    "docs",
    "engine",
    "fixture",
    "handler",
    "index",
    "loader",
    "main",
    "parser",
    "report",
    "server",
    "session",
    "tests",
    "utils",
)
PATHS = (
    "src/main.py",
    "src/utils/io.py",
    "tests/test_parser.py",
    "README.md",
    "docs/guide.md",
    "configs/models.yaml",
    "pyproject.toml",
    "src/server/app.py",
    "scripts/build.sh",
)
# Read-only: an agent pointed at the emulator runs these in a developer's checkout.  No
# test runs or builds (they write caches and artefacts), no plain ``git status`` (it may
# rewrite the index).
COMMANDS = (
    "ls -la",
    "pwd",
    "cat README.md",
    "git log --oneline -5",
    "git --no-optional-locks status --short",
    "git diff --stat",
)
# Paths given to a tool that changes files (``changes_files``) are in a directory of this
# prefix and 8 random hex digits, which no checkout has: such a call cannot overwrite or
# delete anything that exists.
SCRATCH_DIR = "emulator-scratch-"
_CHANGES_FILES = frozenset(
    (
        "write",
        "delete",
        "remove",
        "rm",
        "rmdir",
        "unlink",
        "patch",
        "edit",
        "move",
        "mv",
        "rename",
        "create",
        "save",
        "overwrite",
        "replace",
        "append",
        "insert",
        "mkdir",
        "touch",
        "copy",
        "cp",
        "truncate",
        "put",
        "upload",
        "update",
        "apply",
        "modify",
        "set",
    )
)


def scratch_path(rng: random.Random) -> str:
    """A path under a :data:`SCRATCH_DIR` directory: ``emulator-scratch-<8 hex>/<a path>``."""
    return f"{SCRATCH_DIR}{rng.getrandbits(32):08x}/{PATHS[rng.randrange(len(PATHS))]}"


@functools.lru_cache(maxsize=1024)  # asked once a call of the tool: the same few names
def changes_files(tool_name: str) -> bool:
    """Whether a tool's name says it may change files (``write_file``, ``apply_patch``,
    ``deleteFile``…): a word of its name, split at ``_``, ``-``, ``.``, spaces and case."""
    words = re.findall(r"[a-z]+|[A-Z][a-z]*", tool_name)
    return any(w.lower() in _CHANGES_FILES for w in words)


class Unsatisfiable(Exception):
    """The schema (or a branch of it) admits no value this generator can produce."""


def _bounded(minimum: Any) -> Any:
    if isinstance(minimum, (int, float)) and minimum > _MAX_SIZE:
        raise Unsatisfiable
    return minimum


def value_for_schema(schema: Any, rng: random.Random, *, scratch_paths: bool = False) -> Any:
    """A value valid against ``schema`` (see module doc for the keywords honoured); with
    ``scratch_paths`` every path is under a :data:`SCRATCH_DIR` directory.  A malformed
    schema (a keyword of the wrong type, e.g. ``"allOf": 5``) is one no value can be known
    to satisfy: ``Unsatisfiable``, never a crash."""
    try:
        return _Generator(schema, rng, scratch_paths).value(schema, 0, "")
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, RecursionError):
        raise Unsatisfiable from None


class _Generator:
    def __init__(self, root: Any, rng: random.Random, scratch_paths: bool = False) -> None:
        self._root = root
        self._rng = rng
        self._scratch = scratch_paths

    def value(self, schema: Any, depth: int, hint: str) -> Any:
        if depth > _GIVE_UP_DEPTH or schema is False:
            raise Unsatisfiable
        if not isinstance(schema, dict) or not schema:
            return self._string({}, hint)  # `true` / `{}` accept anything
        schema = self._resolve(schema)
        if "allOf" in schema:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if part is False:
                    raise Unsatisfiable
                merged = _merge(merged, self._resolve(part) if isinstance(part, dict) else {})
            return self.value(merged, depth + 1, hint)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                base = {k: v for k, v in schema.items() if k != key}
                for branch in schema[key]:
                    if branch is False:
                        continue
                    branch = self._resolve(branch) if isinstance(branch, dict) else {}
                    try:
                        return self.value(_merge(base, branch), depth + 1, hint)
                    except Unsatisfiable:
                        continue
                raise Unsatisfiable
        if "const" in schema:
            return copy.deepcopy(schema["const"])
        types = _types(schema)
        if "enum" in schema:
            options = [v for v in schema["enum"] if any(_is_type(v, t) for t in types)]
            if not options:
                raise Unsatisfiable
            return copy.deepcopy(options[self._rng.randrange(len(options))])
        if "default" in schema and any(_is_type(schema["default"], t) for t in types):
            return copy.deepcopy(schema["default"])
        for t in types:
            try:
                return self._of_type(t, schema, depth, hint)
            except Unsatisfiable:
                continue
        raise Unsatisfiable

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        # Local refs only; sibling keywords next to $ref override the target's.
        seen = 0
        while "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#") or seen > _GIVE_UP_DEPTH:
                raise Unsatisfiable
            target: Any = self._root
            for part in filter(None, ref[1:].split("/")):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise Unsatisfiable
                target = target[part]
            if target is False:
                raise Unsatisfiable
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**(target if isinstance(target, dict) else {}), **rest}
            seen += 1
        return schema

    def _of_type(self, t: str, schema: dict[str, Any], depth: int, hint: str) -> Any:
        if t == "object":
            return self._object(schema, depth)
        if t == "array":
            return self._array(schema, depth, hint)
        if t == "string":
            return self._string(schema, hint)
        if t == "integer":
            return self._integer(schema)
        if t == "number":
            return self._number(schema)
        if t == "boolean":
            return self._rng.random() < 0.5
        if t == "null":
            return None
        raise Unsatisfiable

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties") or {}
        required = [name for name in schema.get("required", []) if isinstance(name, str)]
        additional = schema.get("additionalProperties", True)
        min_props = _bounded(schema.get("minProperties", 0))
        max_props = schema.get("maxProperties")
        if max_props is not None and len(set(required)) > max_props:
            raise Unsatisfiable
        out: dict[str, Any] = {}
        for name in dict.fromkeys(required):
            if name in props:
                out[name] = self.value(props[name], depth + 1, name)
            elif additional is False:
                raise Unsatisfiable
            else:
                out[name] = self.value(additional, depth + 1, name)
        for name, sub in props.items():
            if name in out or sub is False:
                continue
            if max_props is not None and len(out) >= max_props:
                break
            wanted = len(out) < min_props or (depth < _MAX_DEPTH and self._rng.random() < 0.5)
            if wanted:
                try:
                    out[name] = self.value(sub, depth + 1, name)
                except Unsatisfiable:
                    pass  # optional: leaving it out is valid
        extra = 0
        while len(out) < min_props:
            if additional is False:
                raise Unsatisfiable
            key = f"extra_{extra}"
            extra += 1
            if key not in props:
                out[key] = self.value(additional, depth + 1, key)
        # Key order follows the schema's property order, as a model would write them.
        order = {name: i for i, name in enumerate(props)}
        return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))

    def _array(self, schema: dict[str, Any], depth: int, hint: str) -> list[Any]:
        items = schema.get("items", True)
        prefix = schema.get("prefixItems")
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix = prefix or []
        lo = _bounded(schema.get("minItems", 0))
        hi = schema.get("maxItems")
        if items is False:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and lo > hi:
            raise Unsatisfiable
        n = max(lo, self._rng.randint(1, 3) if depth < _MAX_DEPTH else lo)
        if hi is not None:
            n = min(n, hi)
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        seen: set[str] = set()
        attempts = 0
        while len(out) < n and attempts < 8 * n + 8:
            attempts += 1
            sub = prefix[len(out)] if len(out) < len(prefix) else items
            try:
                v = self.value(sub, depth + 1, hint)
            except Unsatisfiable:
                break
            key = json.dumps(v, sort_keys=True)
            if unique and key in seen:
                continue
            seen.add(key)
            out.append(v)
        if len(out) < lo:
            raise Unsatisfiable
        return out

    def _string(self, schema: dict[str, Any], hint: str) -> str:
        lo = _bounded(schema.get("minLength", 0))
        hi = schema.get("maxLength")
        if hi is not None and lo > hi:
            raise Unsatisfiable
        s = self._format(schema.get("format")) or self._word(hint.lower())
        while len(s) < lo:
            s += "_" + WORDS[self._rng.randrange(len(WORDS))]
        return s if hi is None else s[:hi]

    def _format(self, fmt: Any) -> str | None:
        if fmt == "date-time":
            return "2025-01-15T12:00:00Z"
        if fmt == "date":
            return "2025-01-15"
        if fmt == "time":
            return "12:00:00"
        if fmt == "email":
            return "dev@example.com"
        if fmt in ("uri", "url"):
            return "https://example.com/docs"
        if fmt == "uuid":
            return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        return None

    def _word(self, hint: str) -> str:
        pick = self._rng.randrange
        if any(k in hint for k in ("path", "file", "dir")):
            return scratch_path(self._rng) if self._scratch else PATHS[pick(len(PATHS))]
        if any(k in hint for k in ("command", "cmd", "shell")):
            return COMMANDS[pick(len(COMMANDS))]
        if "url" in hint:
            return "https://example.com/docs"
        if any(k in hint for k in ("query", "text", "message", "content", "pattern")):
            return " ".join(WORDS[pick(len(WORDS))] for _ in range(1 + pick(3)))
        return WORDS[pick(len(WORDS))]

    def _integer(self, schema: dict[str, Any]) -> int:
        lo_f, lo_strict, hi_f, hi_strict = _bounds(schema)
        lo = None if lo_f is None else (math.floor(lo_f) + 1 if lo_strict else math.ceil(lo_f))
        hi = None if hi_f is None else (math.ceil(hi_f) - 1 if hi_strict else math.floor(hi_f))
        lo, hi = _default_range(lo, hi, 100)
        step = schema.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool) and step > 0:
            k_lo, k_hi = -(-lo // step), hi // step
            if k_lo > k_hi:
                raise Unsatisfiable
            return self._rng.randint(k_lo, k_hi) * step
        if lo > hi:
            raise Unsatisfiable
        return self._rng.randint(lo, hi)

    def _number(self, schema: dict[str, Any]) -> float:
        lo, lo_strict, hi, hi_strict = _bounds(schema)
        lo, hi = _default_range(lo, hi, 100.0)

        def ok(x: float) -> bool:
            above = x > lo if lo_strict else x >= lo
            below = x < hi if hi_strict else x <= hi
            return above and below and math.isfinite(x)

        # A whole number when the bounds admit one: tools declare counts, ids and timeouts
        # as "number" and parse them as integers (Codex's ``yield_time_ms``, ``session_id``).
        r = self._rng.random()
        for x in (round(lo + (hi - lo) * r), math.ceil(lo), math.floor(hi)):
            if ok(x):
                return int(x)
        for x in (round(lo + (hi - lo) * r, 2), (lo + hi) / 2, lo, hi):
            if ok(x):
                return float(x)
        raise Unsatisfiable


def _bounds(schema: dict[str, Any]) -> tuple[float | None, bool, float | None, bool]:
    """(low, low is strict, high, high is strict), merging draft-4 boolean and draft-6+
    numeric ``exclusiveMinimum``/``exclusiveMaximum``."""

    def num(v: Any) -> float | None:
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    lo, lo_strict = num(schema.get("minimum")), False
    hi, hi_strict = num(schema.get("maximum")), False
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if ex_lo is True and lo is not None:
        lo_strict = True
    elif (n := num(ex_lo)) is not None and (lo is None or n >= lo):
        lo, lo_strict = n, True
    if ex_hi is True and hi is not None:
        hi_strict = True
    elif (n := num(ex_hi)) is not None and (hi is None or n <= hi):
        hi, hi_strict = n, True
    return lo, lo_strict, hi, hi_strict


def _default_range(lo: Any, hi: Any, span: Any) -> tuple[Any, Any]:
    # Unbounded sides get a modest range so values look like real arguments.
    if lo is None and hi is None:
        return 0 * span, span
    if lo is None:
        return hi - span, hi
    if hi is None:
        return lo, lo + span
    return lo, hi


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list) and t:
        # Prefer a real value over null when a type list allows both.
        return sorted((x for x in t if isinstance(x, str)), key=lambda x: x == "null")
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return ["object"]
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return ["array"]
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return ["number"]
    if "enum" in schema:
        return ["object", "array", "string", "integer", "number", "boolean", "null"]
    return ["string"]


def _is_type(value: Any, t: str) -> bool:
    if t == "null":
        return value is None
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if t == "array":
        return isinstance(value, list)
    if t == "object":
        return isinstance(value, dict)
    return False


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Shallow merge for allOf/anyOf branches: properties merged, required unioned,
    anything else taken from ``b``."""
    out = {**a, **b}
    if "properties" in a and "properties" in b:
        out["properties"] = {**a["properties"], **b["properties"]}
    if "required" in a and "required" in b:
        out["required"] = list(dict.fromkeys([*a["required"], *b["required"]]))
    return out
