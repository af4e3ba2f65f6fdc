"""The Open Responses OpenAPI document (tests/data/openresponses/) as a JSON-Schema validator.

Each object is validated against one component schema of the document itself, with its
``$ref``s resolved inside the document (JSON Schema 2020-12, the dialect of OpenAPI 3.1).
The schema of a streaming event or an item is chosen by its ``type`` from the document's own
unions: the ``text/event-stream`` answer of ``POST /responses`` for events (which the
document's WebSocket section says server progress messages share) and ``ItemField`` for
items.

The document leaves its objects open (a key it does not declare is allowed).  The validator
closes them (``additionalProperties: false`` on every object schema that declares its
properties; none of them takes properties from a sibling ``allOf``/``oneOf``, so this closes
nothing the document declares), so a key the standard does not know fails too, and each one
the server sends on purpose must be named by the caller (:mod:`tests.support.schemas`).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DOCUMENT = Path(__file__).parent.parent / "data" / "openresponses" / "openapi.json"
_URI = "urn:openresponses:openapi"


@cache
def document() -> dict[str, Any]:
    return json.loads(DOCUMENT.read_text())


def _closed(schema: Any, *, in_all_of: bool = False) -> Any:
    """The schema with every object that declares ``properties`` (and says nothing of other
    keys) closed; the branches of an ``allOf`` stay open, since they share one object."""
    if isinstance(schema, list):
        return [_closed(s, in_all_of=in_all_of) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v, in_all_of=k == "allOf") for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and not in_all_of:
        out["additionalProperties"] = False
    return out


@cache
def _registry() -> Registry:
    closed = {**document(), "components": _closed(copy.deepcopy(document()["components"]))}
    return Registry().with_resource(_URI, Resource.from_contents(closed, default_specification=DRAFT202012))


@cache
def validator(component: str) -> Draft202012Validator:
    """A validator for ``#/components/schemas/<component>`` (closed, see above)."""
    if component not in document()["components"]["schemas"]:
        raise KeyError(f"the Open Responses document has no component schema {component!r}")
    return Draft202012Validator({"$ref": f"{_URI}#/components/schemas/{component}"}, registry=_registry())


def _by_type(union: dict[str, Any]) -> dict[str, str]:
    """``type`` value → component name, for a ``oneOf`` of ``$ref``s discriminated by ``type``."""
    assert union["discriminator"]["propertyName"] == "type", union
    names = [ref["$ref"].rsplit("/", 1)[1] for ref in union["oneOf"]]
    schemas = document()["components"]["schemas"]
    return {schemas[name]["properties"]["type"]["enum"][0]: name for name in names}


@cache
def event_schemas() -> dict[str, str]:
    """Every streaming event's ``type`` → its component (``ResponseCreatedStreamingEvent``, …)."""
    answer = document()["paths"]["/responses"]["post"]["responses"]["200"]["content"]
    return _by_type(answer["text/event-stream"]["schema"])


@cache
def item_schemas() -> dict[str, str]:
    """Every ``ItemField`` item's ``type`` → its component (``Message``, ``FunctionCall``, …)."""
    return _by_type(document()["components"]["schemas"]["ItemField"])


def _ref_name(ref: dict[str, str]) -> str:
    return ref["$ref"].rsplit("/", 1)[1]


@cache
def websocket_error_schema() -> str:
    """The component of a WebSocket error frame, as the document's WebSocket section names it."""
    return _ref_name(document()["paths"]["/responses"]["x-openresponses-websocket"]["errorMessage"])


@cache
def response_schema() -> str:
    """The component of ``POST /responses``'s JSON answer (``ResponseResource``)."""
    return _ref_name(
        document()["paths"]["/responses"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    )


@cache
def compact_schema() -> str:
    """The component of ``POST /responses/compact``'s answer (``CompactResource``)."""
    return _ref_name(
        document()["paths"]["/responses/compact"]["post"]["responses"]["200"]["content"]["application/json"][
            "schema"
        ]
    )


def _not_meant(error: Any) -> bool:
    """A branch error saying the object is not of that branch at all: another ``type`` value
    (the discriminator) or another JSON type (``null`` for an object)."""
    path = list(error.relative_path)
    return path == ["type"] or (path == [] and error.validator == "type")


def _branch(error: Any) -> list[Any]:
    """The violations inside the ``oneOf``/``anyOf`` branch an object meant, for a readable
    failure ([] when that is not clear)."""
    by_branch: dict[Any, list[Any]] = {}
    for c in error.context:
        by_branch.setdefault(c.relative_schema_path[0], []).append(c)
    meant = [errs for errs in by_branch.values() if not any(_not_meant(c) for c in errs)]
    return meant[0] if len(meant) == 1 else []


def errors(component: str, data: Any) -> list[str]:
    """Every violation of ``component`` by ``data``, as ``path: message`` lines (empty if
    valid); under a failed ``oneOf``/``anyOf``, the violations in the branch it meant."""
    lines = []
    for e in sorted(validator(component).iter_errors(data), key=lambda e: list(e.absolute_path)):
        inner = _branch(e) if e.validator in ("oneOf", "anyOf") else []
        lines += [f"{c.json_path}: {c.message}" for c in inner] or [f"{e.json_path}: {e.message}"]
    return lines


def validate(component: str, data: Any) -> None:
    """Raise ``AssertionError`` naming every violation of ``component`` by ``data``."""
    problems = errors(component, data)
    assert not problems, f"not a valid Open Responses {component}:\n  " + "\n  ".join(problems)
