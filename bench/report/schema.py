"""The JSON Schema of ``scaling.json`` (``scaling.schema.json`` beside this module, shipped with
the lab as package data) and :func:`validate`, which every run's document passes before it is
written."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

SCHEMA_FILE = "scaling.schema.json"


@functools.cache
def schema() -> dict[str, Any]:
    """The schema (JSON Schema 2020-12), read once from the package."""
    text = resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schema())
    return Draft202012Validator(schema())


def document_order(part: str | int) -> tuple[int, int, str]:
    """A path element's sort key: list indexes by number (steps[2] before steps[10])."""
    return (0, part, "") if isinstance(part, int) else (1, 0, part)


def violations(doc: Any) -> list[str]:
    """Every way ``doc`` breaks the schema, one line each (``$.path: message``), in document
    order; empty when it is valid."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: [document_order(p) for p in e.absolute_path])
    return [f"{e.json_path}: {e.message}" for e in errors]


def validate(doc: Any) -> None:
    """Return if ``doc`` is a valid ``scaling.json``; raise ``ValueError`` naming the first
    violation's path otherwise (``scaling.json does not match its schema at $.steps[0].nodes:
    ...``)."""
    found = violations(doc)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(f"scaling.json does not match its schema at {found[0]}{more}")
