"""Emulated inference: latency model, prefix cache, scripted output, Serve deployment.

Only the Serve deployments (``deployment.py``, ``whatif_deployment.py``) import Ray;
everything else is plain Python.
"""
