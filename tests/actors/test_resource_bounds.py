"""Inputs that would make one request stall a process others share get a bounded answer
(found by the fuzz suite: bench/fuzz_cases.py)."""

from __future__ import annotations

import base64
import random
import zlib

import pytest

from actors.core.render import compaction_text
from inference.emulator.policy import InvalidMetadata, metadata_overrides
from inference.emulator.schema_values import Unsatisfiable, value_for_schema


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "minItems": 100_000_000},
        {"type": "string", "minLength": 100_000_000},
        {"type": "object", "minProperties": 100_000_000},
    ],
)
def test_huge_schema_minimums_are_unsatisfiable_not_built(schema):
    with pytest.raises(Unsatisfiable):
        value_for_schema(schema, random.Random(0))
    value_for_schema({**schema, list(schema)[1]: 1000}, random.Random(0))  # the bound itself is fine


def test_a_huge_answer_length_knob_is_refused():
    with pytest.raises(InvalidMetadata):
        metadata_overrides([("emulator.text_tokens", "100000000")])
    assert metadata_overrides([("emulator.text_tokens", "65536")]) == {"text_tokens": 65536}


def test_a_compression_bomb_in_a_compaction_item_is_not_inflated():
    bomb = base64.b64encode(zlib.compress(b"a" * 50_000_000, 9)).decode()
    assert len(bomb) < 100_000
    assert compaction_text(bomb) == bomb  # rendered as the opaque blob it is, not inflated
    summary = base64.b64encode(zlib.compress(b"the summary")).decode()
    assert compaction_text(summary) == "the summary"
