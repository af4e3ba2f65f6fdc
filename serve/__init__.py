"""The server: gateway (WebSocket + HTTP ingress), app builder (the composition root),
the app on an embedded Ray (:mod:`serve.embedded`), CLI.
"""
