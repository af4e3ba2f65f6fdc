"""Configuration files in configs/ stay loadable and mean what they say."""

from __future__ import annotations

from pathlib import Path

from serve.config import API_KEYS_ENV, AppConfig, load_app_config, resolve_keys_and_paths

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_equals_the_defaults():
    loaded = load_app_config(ROOT / "configs" / "server.example.yaml", environ={})
    assert loaded == resolve_keys_and_paths(AppConfig(), {})
    assert Path(loaded.store.data_dir).is_absolute()


def test_dotted_overrides_and_partial_inference_section():
    cfg = load_app_config(None, **{"server.port": 9000, "inference.policy": {"tool_rounds": 7}})
    assert cfg.server.port == 9000 and cfg.inference.policy.tool_rounds == 7
    assert {p.id for p in cfg.inference.profiles} == {"emu-fast", "emu-gpu"}


def test_api_keys_come_from_the_file_the_list_and_the_environment(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("from-file\n\n  spaced  \n")
    cfg = load_app_config(None, environ={API_KEYS_ENV: "env-1, env-2,"},
                          **{"server.api_keys": ["listed"], "server.api_keys_file": str(keys)})
    assert set(cfg.server.api_keys) == {"listed", "env-1", "env-2", "from-file", "spaced"}
