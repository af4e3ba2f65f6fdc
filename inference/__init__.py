"""Emulated inference: latency model, prefix cache, scripted output, Serve deployment."""
