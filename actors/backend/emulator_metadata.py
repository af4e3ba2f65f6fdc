"""The emulator's per-request knobs, checked before a create is queued: a create whose
``emulator.*`` metadata the emulator could not take is refused with a 400 naming the key
(docs/emulator.md), instead of failing after its ``response.created``.  The check of the
emulator's backend (:meth:`actors.backend.InferenceClient.check_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping

from inference.emulator import scenario as scripted
from inference.emulator.policy import InvalidMetadata, metadata_overrides

from ..errors import InvalidRequest


def check_emulator_metadata(metadata: Mapping[str, str]) -> None:
    """:class:`~actors.errors.InvalidRequest` for an ``emulator.*`` value the emulator's
    policy would refuse; other keys pass."""
    try:
        metadata_overrides(metadata.items())
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
