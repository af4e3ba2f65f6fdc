"""The emulated inference backend: latency and load model, prefix and breakpoint caches, scripted output, its Serve deployment."""
