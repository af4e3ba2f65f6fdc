"""The server: gateway (WebSocket + HTTP ingress), app builder (the composition root),
the app on an embedded Ray (:mod:`serve.embedded`), CLI.

Only ``gateway.py``, ``builder.py`` and ``embedded.py`` import Ray (tests/test_layout.py).
"""
