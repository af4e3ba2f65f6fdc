"""serve/local_node_type.py: the local provider's prepared config made elastic (pure)."""

from __future__ import annotations

import pytest
import yaml

from serve.local_node_type import NODE_TYPE, NotALocalConfig, elastic, main


def prepared(workers: int) -> dict:
    return {
        "provider": {
            "type": "local",
            "head_ip": "10.0.0.10",
            "worker_ips": [f"10.0.0.{11 + i}" for i in range(workers)],
        },
        "max_workers": workers,
        "available_node_types": {
            NODE_TYPE: {"node_config": {}, "resources": {}, "min_workers": workers, "max_workers": workers}
        },
        "head_node_type": NODE_TYPE,
    }


@pytest.mark.parametrize(
    ("workers", "always_up", "outcome"),
    [
        (3, 3, (3, 3)),  # every host up: the shipped behaviour before any grows
        (14, 5, (5, 14)),
        (3, 0, (0, 3)),
        (3, 4, "error"),  # more than the hosts listed
        (3, -1, "error"),
    ],
)
def test_the_node_type_offers_a_session_host_and_keeps_the_first_hosts_up(workers, always_up, outcome):
    if outcome == "error":
        with pytest.raises(NotALocalConfig):
            elastic(prepared(workers), always_up)
        return
    node_type = elastic(prepared(workers), always_up)["available_node_types"][NODE_TYPE]
    assert node_type["resources"] == {"session": 1}
    assert (node_type["min_workers"], node_type["max_workers"]) == outcome


def test_a_config_not_prepared_for_the_local_provider_is_refused_with_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"provider": {"type": "aws"}, "available_node_types": {"session": {}}}))
    assert main([str(path), "--always-up", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a prepared local-provider config" in err
