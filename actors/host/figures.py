"""The one seam through which measurement reaches a connection's hot path: a response's
server figures (:mod:`actors.core.timings`) once it has finished.

Two observers want them: the host's phase histogram (``responses_ws_phase_seconds``, the
``observe`` sink a session host passes in), which records each response's figures as they
were taken when it finished (:meth:`Figures.keep`, a loop step after its events are queued,
so not in the client's wait); and the client, when its create's ``metadata`` has
``"responses_ws.timings": "1"`` (the figures go into the terminal response's metadata:
``bench floor`` and ``bench capacity`` ask for them).  Only for the client are they taken
again as the terminal event leaves: a connection keeps a finished response's
:class:`~actors.core.timings.Report` only when its client asked and its figures may still
change (a stored response's record holds them as sent), and the sender consults this stage
only while a report is kept (:attr:`Figures.pending`).  So a response whose client did not
ask is encoded and written with no restamp and no splice, whether or not the host records
its figures.

Where a report is kept, its figures are taken again as the sender is about to encode the
terminal event (:meth:`Figures.outgoing`), so ``api_overhead`` holds everything before that
frame; over a WebSocket a frame that carries them goes in fragments (:func:`split`), its
figures taken once the bulk is written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable

from ..core.timings import METADATA_KEY, Report
from ..protocol import TERMINAL_EVENTS, ServerEvent

_UNESCAPED = json.JSONEncoder(ensure_ascii=False).encode  # made once: json.dumps makes one a call

Observe = Callable[[str, dict[str, float]], None]  # (transport, milliseconds by phase)
Tail = Callable[[], str]  # the rest of a terminal frame whose first part is out (:func:`split`)


class Figures:
    """One connection's figures on their way out: the reports of its finished responses
    that someone observes, by response id, until their terminal event is sent."""

    def __init__(self, transport: str, observe: Observe | None) -> None:
        self._transport = transport
        self._observe = observe
        self._reports: dict[str, Report] = {}

    def keep(self, reports: Iterable[Report]) -> None:
        """The reports of responses that just finished: recorded by the host's observer, if
        there is one, in a later loop step, as they are; kept for their terminal event only if
        its client asked for the figures and they may still change."""
        observe = self._observe
        for report in reports:
            if observe is not None:
                asyncio.get_running_loop().call_soon(observe, self._transport, report.ms)
            if report.into is not None and not report.final:
                self._reports[report.response_id] = report

    @property
    def pending(self) -> bool:
        """A kept report waits for its terminal event: the sender runs this stage."""
        return bool(self._reports)

    def take(self, event: ServerEvent) -> Report | None:
        """The kept report of the terminal event ``event``, handed out once (``None``: its
        frame carries no figures that change)."""
        if not isinstance(event, TERMINAL_EVENTS):
            return None
        return self._reports.pop(event.response.id, None)

    def outgoing(self, event: ServerEvent) -> ServerEvent:
        """``event``, about to be encoded and written whole (an SSE chunk): a terminal event's
        figures, if its client asked for them, are taken again now."""
        report = self.take(event)
        if report is not None:
            report.restamp()
        return event

    def split(
        self, event: ServerEvent, report: Report, encode: Callable[[ServerEvent], list[str]], mark: str
    ) -> tuple[list[str], Tail | None]:
        """A terminal event whose client asked for the figures, as the fragments of one message
        (RFC 6455 §5.4): the text up to the figures (in the pieces ``encode`` gave it in, as
        :meth:`~actors.protocol.EventEncoder.pieces`), and what makes the rest — called once that
        part has been encoded, compressed and written, it takes the figures, which go with the
        few bytes after them (a response's metadata comes after its output and its echoed
        instructions and tools).  No rest (``None``): the text is the whole frame (the event
        could not be encoded; ``encode`` gave the server_error frame in its place).

        The one place figures are spliced into encoded JSON, by choice: the event is encoded
        once with ``mark`` (text no client spells) where the figures go, and the figures
        replace it once the bulk is written, so they hold the terminal frame's own work but
        its last bytes (docs/performance.md).  Taken as data before the frame is encoded, they
        would leave its encoding, compression and write out of ``api_overhead``."""
        assert report.into is not None
        report.into[METADATA_KEY] = mark
        pieces = encode(event)
        quoted = json.dumps(mark)
        for i in range(len(pieces) - 1, -1, -1):  # the metadata is in the last piece but the echoes
            text = pieces[i]
            at = text.find(quoted)
            if at >= 0:
                break
        else:
            report.restamp()
            return pieces, None
        after = [text[at + len(quoted) :], *pieces[i + 1 :]]

        def rest() -> str:
            report.restamp()  # writes the figures into the metadata
            assert report.into is not None
            return _UNESCAPED(report.into[METADATA_KEY]) + "".join(after)

        return [*pieces[:i], text[:at]], rest
