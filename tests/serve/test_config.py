"""Configuration files in configs/ stay loadable and mean what they say."""

from __future__ import annotations

from pathlib import Path

from serve.config import AppConfig, load_app_config

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_equals_the_defaults():
    assert load_app_config(ROOT / "configs" / "server.example.yaml") == AppConfig()


def test_dotted_overrides_and_partial_inference_section():
    cfg = load_app_config(None, **{"server.port": 9000, "inference.policy": {"tool_rounds": 7}})
    assert cfg.server.port == 9000 and cfg.inference.policy.tool_rounds == 7
    assert {p.id for p in cfg.inference.profiles} == {"emu-fast", "emu-gpu"}
