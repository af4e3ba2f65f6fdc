"""``responses-ws serve --scenario FILE``: a scenario file becomes the configuration's
``inference.policy.scenario``, checked like the rest of the configuration."""

from __future__ import annotations

import pytest

from inference.emulator import scenario as sc
from serve.cli import scenario_file
from serve.config import load_app_config


def test_a_scenario_file_configures_the_server(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text("- text: hello\n- {error: {code: server_error, message: scripted}}\n")
    config = load_app_config(None, **{"inference.policy.scenario": scenario_file(path)})
    assert config.inference.policy.scenario == sc.Scenario(
        turns=[
            sc.ScriptedTurn(text="hello"),
            sc.ScriptedTurn(error=sc.ScriptedError(code="server_error", message="scripted")),
        ]
    )
    path.write_text("- {text: a, text_tokens: 3}\n")
    with pytest.raises(ValueError):
        load_app_config(None, **{"inference.policy.scenario": scenario_file(path)})
