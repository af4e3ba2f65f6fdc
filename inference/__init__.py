"""Emulated inference: latency model, prefix cache, scripted output, Serve deployment.

Only ``inference/deployment.py`` imports Ray; everything else is plain Python.
"""
