"""Benchmarks: clients of a responses-ws server, run as ``responses-ws bench <kind>``
(``responses-ws bench`` alone runs ``agentloop``; ``responses-ws bench --help`` lists the
kinds) and ``responses-ws demo``.  The server never imports this package.

A kind is a module of this package that has

- a module docstring: its ``--help`` text;
- ``add_arguments(parser: argparse.ArgumentParser) -> None``: its options;
- ``run(args: argparse.Namespace) -> int``: the benchmark; returns the exit code.
  ``args.command`` is the command line as typed (for the results file).

and one entry in :data:`KINDS` (name → module, one-line summary).  A module is imported
only when its kind runs, after :mod:`bench.cli` made sure the ``bench`` extra (rich,
matplotlib, psutil, hypothesis, httpx) is installed, so it may use the extra freely.  A
kind that needs a server of its own starts it with
:func:`serve.embedded.embedded_server`; its WebSocket traffic goes through
:mod:`bench.client`.
"""

from __future__ import annotations

from typing import NamedTuple


class Kind(NamedTuple):
    module: str
    summary: str


KINDS: dict[str, Kind] = {
    "agentloop": Kind("bench.run", "agent loops over ws / http-chained / http-full, side by side (default)"),
    "hotpath": Kind("bench.hotpath", "per-turn server overhead and sustained streaming rate"),
    "overhead": Kind("bench.overhead", "per-turn API overhead against conversation length, WebSocket vs HTTP"),
    "emulator": Kind("bench.emulator", "fidelity of the emulated inference deployment to its model"),
    "scaling": Kind("bench.scaling", "load and idle connections on a simulated multi-node cluster"),
    "soak": Kind("bench.soak", "hundreds of checked WebSocket agent chains at once, memory over time"),
    "fuzz": Kind("bench.fuzz", "hostile WebSocket frames and HTTP requests, every answer judged"),
    "memory": Kind("bench.conn_memory", "one connection's memory as its cache grows past the cap"),
    "admission": Kind("bench.admission", "bursts, arrival ramps and held connections: admission at scale"),
    "burst": Kind("bench.burst", "first turns of resumed sessions all at once: how long each socket waits"),
    "floor": Kind("bench.floor", "non-model time per turn against a minimal server sending the same frames"),
}
DEFAULT_KIND = "agentloop"
