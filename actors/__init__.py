"""Per-connection session state: protocol, session core, and the Ray actor that hosts it.

Only ``actors/actor.py`` imports Ray; the rest is a sans-I/O core.
"""
