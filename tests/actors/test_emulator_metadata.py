"""The emulator's metadata check (actors.backend.emulator_metadata): a valid set of
``emulator.*`` items is remembered by value, a refused one is refused every time."""

from __future__ import annotations

import pytest

from actors.backend import emulator_metadata
from actors.backend.emulator_metadata import check_emulator_metadata
from actors.errors import InvalidRequest


def test_a_valid_set_is_checked_once_and_a_refused_one_every_time() -> None:
    emulator_metadata._check.cache_clear()
    good = {"emulator.tool_rounds": "8", "emulator.text_tokens": "150", "trace": "x"}
    for _ in range(3):
        check_emulator_metadata(good)
    check_emulator_metadata({**good, "trace": "y"})  # other keys are not the emulator's
    info = emulator_metadata._check.cache_info()
    assert (info.misses, info.hits, info.currsize) == (1, 3, 1)
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=r"emulator\.tool_rounds"):
            check_emulator_metadata({"emulator.tool_rounds": "lots"})
    assert emulator_metadata._check.cache_info().currsize == 1
    check_emulator_metadata({"other": "knob"})  # no emulator.* item: nothing to check
    assert emulator_metadata._check.cache_info().currsize == 1
