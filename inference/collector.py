"""The garbage collector's policy in this server's long-running processes (the session
hosts, the gateway, the inference replicas).

CPython's full collection walks every tracked container object, and a started server
process holds well over a hundred thousand that it never frees (Ray's, pydantic's schemas,
the modules, the tokenizer): with only those, a full collection costs about 80 ms of CPU on
the 2-core reference node (``python -m investigations.gc_pause``), and it runs on the
event loop that serves every connection of the process, whenever the objects the
connections keep have grown by a quarter.  :func:`freeze_startup`, called once a process
is warm, collects once and moves everything alive to the permanent generation
(``gc.freeze``): later collections walk only what was made since.  Nothing it froze is
ever collected, so it is called after start-up, not while serving.
"""

from __future__ import annotations

import gc


def freeze_startup() -> int:
    """Collect, then freeze what is alive (what start-up made); returns how many objects
    are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


__all__ = ["freeze_startup"]
