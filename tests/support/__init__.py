"""What the tests share besides fixtures (those stay in conftest.py files):

- :mod:`.server` — test apps on the suite's embedded Ray;
- :mod:`.redis` — a throw-away ``redis-server``;
- :mod:`.wire` — strict validation of received frames, collecting a response's events;
- :mod:`.event_order` — event-sequence assertions read as the protocol page's tables;
- :mod:`.fuzz` — the hypothesis settings of the fuzz tests;
- :mod:`.cluster_scenario` — the multi-node scenario run in a child process;
- :mod:`.serve_process`, :mod:`.ray_cluster` — ``responses-ws serve`` as a child process, a
  ``ray start`` cluster of a test's own;
- :mod:`.children` — starting those children together, one Ray start after another (across
  the parallel workers too: ``ray_start_lock``);
- :mod:`.waiting` — waiting for a condition with a deadline (never a fixed sleep), and an
  event loop whose clock a test moves on;
- :mod:`.session_driver` — the session core driven by the product's driver, its effects
  recorded.

What a client reads off the wire (the final event types, a response's ``output_text``) is the
lab's client, :mod:`bench.client`, and how a ``redis-server`` or a ``ray start`` node is
started and waited on is :mod:`bench.services` (the multi-node harness's too): the tests
import them from the lab, not a copy.  The fake inference backend is the product's own,
:mod:`actors.backend.canned`.
"""
