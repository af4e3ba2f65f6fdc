"""The emulator's per-request knobs, checked before a create is queued: a create whose
``emulator.*`` metadata the emulator could not take is refused with a 400 naming the key
(docs/emulator.md), instead of failing after its ``response.created``.  The check of the
emulator's backend (:meth:`actors.backend.InferenceClient.check_metadata`).

A crowd's connections send the same knobs with every create, so the ``emulator.*`` items
found valid are remembered (the last ``CHECKED`` sets, by value): the policy's check of
each value (tens of microseconds a create) runs once a process for each distinct set.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from inference.emulator import scenario as scripted
from inference.emulator.policy import InvalidMetadata, metadata_overrides

from ..errors import InvalidRequest

CHECKED = 256  # distinct sets of emulator.* items remembered valid (a refused set is checked each time)
_PREFIX = "emulator."


@functools.lru_cache(maxsize=CHECKED)
def _check(items: tuple[tuple[str, str], ...]) -> None:
    metadata_overrides(items)  # raises for an invalid value: then nothing is remembered


def check_emulator_metadata(metadata: Mapping[str, str]) -> None:
    """:class:`~actors.errors.InvalidRequest` for an ``emulator.*`` value the emulator's
    policy would refuse; other keys pass."""
    items = tuple((k, v) for k, v in metadata.items() if k.startswith(_PREFIX))
    if not items:
        return
    try:
        _check(items)
    except InvalidMetadata as exc:
        expected = (
            "a scenario as JSON (docs/replay.md)"
            if exc.key in scripted.METADATA_KEYS
            else "a whole number within the policy's bounds"
        )
        raise InvalidRequest(
            f"Invalid value for metadata key '{exc.key}': expected {expected}.",
            param=f"metadata.{exc.key}",
        ) from None
