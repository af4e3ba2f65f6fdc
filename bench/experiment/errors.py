"""The experiment's typed errors."""

from __future__ import annotations


class SetupError(Exception):
    """The cluster or the command cannot run the experiment: one line for the user
    (``responses-ws bench scaling: <message>``), exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
