"""The head of a ``local``-provider cluster (configs/cluster-local.yaml) makes its autoscaler
able to add session hosts: run on the head before ``ray start --head
--autoscaling-config=~/ray_bootstrap_config.yaml``, it edits that file (the config as ``ray
up`` prepared it) so that its one node type, ``local.cluster.node``, offers ``session: 1``
(what a pending gateway replica asks for) and keeps ``--always-up`` hosts running.

Why here and not in the YAML: Ray 2.60's local provider takes no node types from the user (a
YAML with ``local.cluster.node`` skips ``ray up``'s defaults and fails its validation), the
node type it makes has no resources (its autoscaler learns only CPU, GPU and memory from
running hosts, so a pending ``session: 1`` would never launch one), and a top-level
``min_workers`` is not in Ray's cluster schema.  The role a host really gets is still
``ray start --resources`` by its address (worker_start_ray_commands): the local provider
launches the next free host of ``worker_ips`` in their order, so the YAML lists the always-up
hosts first and the session hosts that come and go last (docs/deploy.md).

    python -m serve.local_node_type ~/ray_bootstrap_config.yaml --always-up 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

NODE_TYPE = "local.cluster.node"  # the one node type Ray's local provider prepares
ROLE = {"session": 1}  # what a host the autoscaler adds is for


class NotALocalConfig(ValueError):
    pass


def elastic(config: dict[str, Any], always_up: int) -> dict[str, Any]:
    """The prepared config with its node type offering a session host, ``always_up`` of its
    hosts kept running and all of them allowed (pure)."""
    types = config.get("available_node_types") or {}
    if config.get("provider", {}).get("type") != "local" or NODE_TYPE not in types:
        raise NotALocalConfig(f"not a prepared local-provider config (no {NODE_TYPE} node type)")
    hosts = len(config["provider"].get("worker_ips", []))
    if not 0 <= always_up <= hosts:
        raise NotALocalConfig(f"--always-up {always_up}: the config lists {hosts} worker_ips")
    node_type = dict(types[NODE_TYPE], resources=dict(ROLE), min_workers=always_up, max_workers=hosts)
    return dict(
        config,
        max_workers=hosts,
        available_node_types={**types, NODE_TYPE: node_type},
        head_node_type=NODE_TYPE,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m serve.local_node_type", description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path, help="the prepared cluster config (~/ray_bootstrap_config.yaml)")
    p.add_argument("--always-up", type=int, required=True, help="hosts kept running: the first of worker_ips")
    args = p.parse_args(argv)
    try:
        edited = elastic(yaml.safe_load(args.config.expanduser().read_text()), args.always_up)
    except (OSError, yaml.YAMLError, NotALocalConfig) as exc:
        print(f"serve.local_node_type: {exc}", file=sys.stderr)
        return 2
    args.config.expanduser().write_text(yaml.safe_dump(edited, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
