"""The server: gateway (WebSocket + HTTP ingress), app builder (the composition root),
the app on an embedded Ray (:mod:`serve.embedded`), CLI.

Only ``gateway.py``, ``builder.py``, ``embedded.py``, ``logs.py`` and ``metrics.py`` import Ray
(tests/test_layout.py).
"""
