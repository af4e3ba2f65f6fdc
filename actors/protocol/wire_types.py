"""The wire's loose JSON, named once: what a client sends (or is echoed) that the protocol
keeps as it came rather than modelling it field by field."""

from __future__ import annotations

from typing import Any, TypeAlias

JSONObject: TypeAlias = dict[str, Any]  # one JSON object, as json.loads gives it
