"""The shapes of ``response.inject`` and its answers (docs/protocol.md §2.5, §3.7 quote
``beta_events.schema.json``): every such frame a test sees validates against them, and
against the openai SDK's beta types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from pydantic import TypeAdapter

SCHEMA = json.loads((Path(__file__).with_name("beta_events.schema.json")).read_text())
BETA_SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(BetaResponsesServerEvent)
INJECT_ANSWERS = ("response.inject.created", "response.inject.failed")


def check(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` (a client ``response.inject`` or one of its answers) against the documented
    shape; an answer against the SDK's beta server-event union too."""
    kind = event["type"]
    Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{kind}"}).validate(event)
    if kind in INJECT_ANSWERS:
        parsed = BETA_SERVER_EVENT.validate_python(event)
        assert parsed.type == kind
    return event
