"""Benchmarks: clients of a responses-ws server, run as ``responses-ws bench <kind>``
(``responses-ws bench`` alone runs ``agentloop``; ``responses-ws bench --help`` lists the
kinds), ``responses-ws demo`` and ``responses-ws replay``.  The lab is a distribution of its own
(``responses-ws-bench``, bench/pyproject.toml): the server never imports it and its wheel holds
none of it; ``responses-ws``'s CLI loads :mod:`bench.commands` by name when it is installed.

Layout (docs/benchmark.md, "Layout"):

- ``bench/kinds/<kind>.py``: one module per command, named as the command runs
  (``responses-ws bench memory`` is :mod:`bench.kinds.memory`; ``responses-ws demo`` is
  :mod:`bench.kinds.demo`, ``responses-ws replay`` :mod:`bench.kinds.replay`); a kind with
  variants (one measurement, differing in what varies) has a module per variant,
  ``<kind>_<variant>.py`` beside the first variant's ``<kind>.py`` (``responses-ws bench floor
  hotpath`` is :mod:`bench.kinds.floor_hotpath`); :data:`ALIASES` are earlier names of variants.
  A kind module has a docstring (its ``--help`` text),
  ``add_arguments(parser)`` (its options) and ``run(args) -> int`` (the exit code);
  ``args.command`` is the command line as typed and ``args.run`` the :class:`bench.results.Run`
  its results file records.  A kind is imported only when it runs, after :mod:`bench.commands` made
  sure the lab's dependencies (rich, matplotlib, psutil, hypothesis, httpx, openai, redis) are installed.
- the library the kinds share, one concept a module: :mod:`bench.client` (the WebSocket
  client), :mod:`bench.transports` (one agent turn over ws / http-chained / http-full /
  append: floor length's and the replay's), :mod:`bench.workload` (the agent-loop workload and its presets),
  :mod:`bench.runner` (the load runner; its ``rollouts`` workload runs the agentloop kind's rollouts),
  :mod:`bench.rollouts` (those rollouts' records, one a rollout and transport), :mod:`bench.agentloop_report`
  and :mod:`bench.breakdown` (summaries, tables, where a turn's time goes),
  :mod:`bench.sweeps`, :mod:`bench.results` (the one results writer), :mod:`bench.plotting`
  (the one matplotlib setup), :mod:`bench.processes` (memory and CPU of the server's Ray
  processes), :mod:`bench.cluster` (a simulated multi-node cluster); the soak's
  :mod:`bench.invariants` (the stream invariants the runner checks for it) and :mod:`bench.soak_report`; the ledger and drain kinds' :mod:`bench.reconcile`; the fuzzer's
  :mod:`bench.fuzz_cases` and :mod:`bench.fuzz_oracle`; the replay's :mod:`bench.replay`
  (recorded sessions read into shapes, re-synthesised and driven step by step).

A kind that needs a server of its own starts it with :func:`serve.embedded.embedded_server`.
Investigations a page cites that are not commands of the product live outside the wheel, in
``investigations/`` (run from a checkout).
"""

from __future__ import annotations

from typing import NamedTuple


class Variant(NamedTuple):
    name: str
    summary: str


class Kind(NamedTuple):
    """A ``responses-ws bench`` kind; with ``variants``, ``bench NAME [VARIANT]`` runs one of them
    (the first without a word): what one measurement does in ways that differ in what varies."""

    name: str
    summary: str
    variants: tuple[Variant, ...] = ()

    @property
    def module(self) -> str:
        """The module of the kind (of its first variant)."""
        return f"{__name__}.kinds.{self.name}"

    @property
    def variant_names(self) -> tuple[str, ...]:
        return tuple(variant.name for variant in self.variants)

    def variant_module(self, variant: str) -> str:
        """The module of ``variant``: the kind's own for the first, ``kinds/<name>_<variant>.py`` else."""
        if variant not in self.variant_names:
            raise KeyError(f"{self.name} has no variant {variant!r}")
        return self.module if variant == self.variants[0].name else f"{self.module}_{variant}"


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("agentloop", "agent loops over ws / http-chained / http-full, side by side (default)"),
        Kind("scaling", "load and idle connections on a simulated multi-node cluster"),
        Kind("soak", "hundreds of checked WebSocket agent chains at once, memory over time"),
        Kind("fuzz", "hostile WebSocket frames and HTTP requests, every answer judged"),
        Kind("memory", "one connection's memory as its cache grows past the cap"),
        Kind("admission", "bursts, arrival ramps and held connections: admission at scale"),
        Kind(
            "floor",
            "one socket's cost per turn outside the model",
            (
                Variant(
                    "reference",
                    "non-model time and CPU per turn against a minimal server sending the same frames",
                ),
                Variant(
                    "hotpath",
                    "per-turn server overhead with an instant model; --streams: a round of bench streams",
                ),
                Variant("length", "per-turn API overhead against conversation length, WebSocket vs HTTP"),
            ),
        ),
        Kind(
            "capacity",
            "N concurrent Codex-like loops from client processes: a node's turns/s, latency and CPU",
        ),
        Kind("neighbours", "a turn on an open socket while HTTP clients and resumed sockets load the host"),
        Kind(
            "streams",
            "many WebSocket streams at once on the ideal-hardware profile, rates as the clients see them",
        ),
        Kind(
            "ledger",
            "the usage ledger reconciled with what the clients saw, under kills",
            (
                Variant("hosts", "session hosts SIGKILLed under load (an embedded server, SQLite)"),
                Variant(
                    "nodes",
                    "session nodes SIGKILLed with their disk under store:false load (real nodes, Redis)",
                ),
            ),
        ),
        Kind(
            "resume", "resumes on real nodes: reconnect to the next turn's first event, against a steady turn"
        ),
        Kind("drain", "redeploys under hundreds of sockets mid-turn: nothing reset, lost or unanswered"),
        Kind(
            "fidelity", "one conversation on a real engine and on its emulated twin: cached tokens and timing"
        ),
    )
}
# Earlier names of a kind's variant, kept as commands (docs/benchmark.md, "Layout"): name → (kind, variant).
ALIASES: dict[str, tuple[str, str]] = {
    "hotpath": ("floor", "hotpath"),
    "overhead": ("floor", "length"),
    "nodeledger": ("ledger", "nodes"),
}
DEFAULT_KIND = "agentloop"
DEMO_MODULE = f"{__name__}.kinds.demo"
REPLAY_MODULE = f"{__name__}.kinds.replay"  # its library: bench.replay
