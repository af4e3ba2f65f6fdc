"""The server: gateway (WebSocket + HTTP ingress), app builder (the composition root), CLI.

Only ``serve/gateway.py`` imports Ray.
"""
