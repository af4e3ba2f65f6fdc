"""Investigations a page of docs/ cites that are not commands of the product: run from a
checkout, ``.venv/bin/python -m investigations.<name> [options]`` (``--help`` for its
options; they need the ``bench`` extra, as ``responses-ws bench`` does).  Not in the wheel.

- :mod:`investigations.burst`: first turns of resumed sessions all at once, how long each
  socket waits (docs/performance.md);
- :mod:`investigations.first_create`: a crowd's first creates on one session host, the
  host's CPU per first create by phase, in this process (docs/performance.md);
- :mod:`investigations.storm_cpu`: the CPU each server role spends on ``bench capacity``'s
  storm of first turns, per first create, from each process's own CPU time;
- :mod:`investigations.storm_host`: that storm on one session host in this process (real
  sockets, a canned model), round after round: the host's CPU a first create, its event-loop
  lag, the storm's wall time, by stage or profiled;
- :mod:`investigations.emulator`: the emulated inference deployment against its own model,
  driven through its Serve handle from this process (docs/emulator-fidelity.md);
- :mod:`investigations.handover`: a listener leaving the port under a connection flood, a
  ``SO_REUSEPORT`` group against one shared socket (docs/reliability.md).

A module here has the shape of a ``bench`` kind (:mod:`bench`): a docstring, ``add_arguments``
and ``run``, and ends with :func:`main`'s call.
"""

from __future__ import annotations

import sys


def main(module: str) -> int:
    """Run ``module`` as ``responses-ws bench`` runs a kind: parse its options, record the run."""
    from bench.commands import run_module

    return run_module(module, f"python -m {module}", sys.argv[1:])
