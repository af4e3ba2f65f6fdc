"""A Ray cluster of real nodes on one machine: each node in a network namespace of its own on
a bridge the harness creates, Redis on the head, HAProxy in front (:class:`Harness`)."""

from .harness import Harness
from .topology import NodeSpec, Topology

__all__ = ["Harness", "NodeSpec", "Topology"]
