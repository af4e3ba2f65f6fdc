"""Configuration files in configs/ stay loadable and mean what they say."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve.config import (
    API_KEYS_ENV,
    AppConfig,
    app_config_from_dict,
    load_app_config,
    resolve_keys_and_paths,
)

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_equals_the_defaults():
    loaded = load_app_config(ROOT / "configs" / "server.example.yaml", environ={})
    assert loaded == resolve_keys_and_paths(AppConfig(), {})
    assert Path(loaded.store.data_dir).is_absolute()


def test_dotted_overrides_and_partial_inference_section():
    cfg = load_app_config(None, **{"server.port": 9000, "inference.policy": {"tool_rounds": 7}})
    assert cfg.server.port == 9000 and cfg.inference.policy.tool_rounds == 7
    assert {p.id for p in cfg.inference.profiles} == {"emu-fast", "emu-gpu", "emu-cache"}


def test_api_keys_come_from_the_file_the_list_and_the_environment(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("from-file\n\n  spaced  \n")
    cfg = load_app_config(
        None,
        environ={API_KEYS_ENV: "env-1, env-2,"},
        **{"server.api_keys": ["listed"], "server.api_keys_file": str(keys)},
    )
    assert set(cfg.server.api_keys) == {"listed", "env-1", "env-2", "from-file", "spaced"}


# ------------------------------------------------------------------ sources and precedence


def test_partial_sections_merge_at_every_depth(tmp_path):
    """A file, the environment and flags each set a few nested keys; everything else keeps
    its default (a partial inference section keeps the packaged profiles)."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "session:\n  safety:\n    lexicon: [forbidden words]\n"
        "inference:\n  prefix_cache:\n    block_tokens: 64\n"
    )
    cfg = load_app_config(
        path,
        environ={"RESPONSES_WS_SESSION__SAFETY__INJECTION_WEIGHT": "0.25"},
        sets=["inference.policy.seed=7"],
    )
    defaults = AppConfig()
    assert cfg.session.safety.lexicon == ("forbidden words",)
    assert cfg.session.safety.injection_weight == 0.25
    assert cfg.session.safety.enabled == defaults.session.safety.enabled
    assert cfg.inference.prefix_cache.block_tokens == 64
    assert cfg.inference.prefix_cache.capacity_tokens == defaults.inference.prefix_cache.capacity_tokens
    assert (
        cfg.inference.policy.seed == 7
        and cfg.inference.policy.tool_rounds == defaults.inference.policy.tool_rounds
    )
    assert cfg.inference.profiles == defaults.inference.profiles


def test_every_key_has_an_environment_variable_with_a_yaml_value():
    env = {
        "RESPONSES_WS_SESSION__CONNECTIONS_PER_ACTOR": "64",
        "RESPONSES_WS_SERVER__API_KEYS": "[k1, k2]",
        "RESPONSES_WS_SESSION__PING_INTERVAL_S": "null",
        "RESPONSES_WS_STORE__BACKEND": "redis",
        "RESPONSES_WS_INFERENCE__SCALING__SESSION_AFFINITY": "false",
        "RESPONSES_WS_API_KEYS": "k3",  # not a key: the accepted-keys list (no "__")
        "OTHER__VARIABLE": "ignored",
    }
    cfg = load_app_config(None, environ=env)
    assert cfg.session.connections_per_actor == 64
    assert cfg.server.api_keys == ("k1", "k2", "k3")
    assert cfg.session.ping_interval_s is None
    assert cfg.store.backend == "redis"
    assert cfg.inference.scaling.session_affinity is False


def test_an_unknown_environment_key_is_an_error_naming_it():
    with pytest.raises(ValueError, match="RESPONSES_WS_SESION__MAX_INFLIGHT"):
        load_app_config(None, environ={"RESPONSES_WS_SESION__MAX_INFLIGHT": "3"})
    with pytest.raises(ValueError, match="no_such_key"):
        load_app_config(None, environ={"RESPONSES_WS_SESSION__NO_SUCH_KEY": "3"})


def test_precedence_flag_over_environment_over_file_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("session:\n  max_inflight: 2\n  max_named_lanes: 2\n  max_actors: 2\n")
    env = {"RESPONSES_WS_SESSION__MAX_NAMED_LANES": "3", "RESPONSES_WS_SESSION__MAX_ACTORS": "3"}
    cfg = load_app_config(path, environ=env, sets=["session.max_actors=4"])
    assert cfg.session.max_inflight == 2  # file over the default (16)
    assert cfg.session.max_named_lanes == 3  # environment over the file
    assert cfg.session.max_actors == 4  # --set over the environment
    assert cfg.session.max_starting_actors == AppConfig().session.max_starting_actors  # the default
    # --port (a keyword override) over --set
    assert load_app_config(None, environ={}, sets=["server.port=1"], **{"server.port": 2}).server.port == 2


def test_set_values_are_yaml():
    cfg = load_app_config(
        None,
        environ={},
        sets=[
            "server.gateway_resources={session: 1}",
            "session.strict_params=true",
            "server.host=0.0.0.0",
            "server.api_keys=[a, b]",
        ],
    )
    assert cfg.server.gateway_resources == {"session": 1.0}
    assert cfg.session.strict_params is True
    assert cfg.server.host == "0.0.0.0"
    assert cfg.server.api_keys == ("a", "b")


@pytest.mark.parametrize("bad", ["session", "session.=3", "=3", ".x=1"])
def test_a_malformed_set_is_an_error(bad):
    with pytest.raises(ValueError):
        load_app_config(None, environ={}, sets=[bad])


def test_a_serve_config_args_mapping_takes_the_environment_too():
    cfg = app_config_from_dict(
        {"session": {"max_inflight": 2}}, environ={"RESPONSES_WS_SESSION__MAX_INFLIGHT": "5"}
    )
    assert cfg.session.max_inflight == 5


def test_log_flags_refine_the_config_logs_section():
    from actors.logs import LogSettings
    from serve.cli import log_settings, parser

    configured = LogSettings("ERROR", "JSON")
    assert log_settings(parser().parse_args(["serve"]), configured) == configured
    args = parser().parse_args(["serve", "--log-format", "text"])
    assert log_settings(args, configured) == LogSettings("ERROR", "TEXT")
    args = parser().parse_args(["serve", "--log-level", "debug", "--log-format", "json"])
    assert log_settings(args, LogSettings()) == LogSettings("DEBUG", "JSON")


def test_serve_help_shows_the_defaults():
    from serve.cli import parser

    sub = parser()._subparsers._group_actions[0].choices["serve"]
    text = " ".join(sub.format_help().split())
    assert "(default: the config's logs.level, WARNING)" in text and "(default: 8265)" in text
    assert "default: the config's logs.encoding, TEXT" in text
    assert "(default: server.port, 8765)" in text and "(default: server.host, 127.0.0.1)" in text
    assert "defaults < --config FILE < environment" in text


# ------------------------------------------------------------------ what-if services


def test_the_what_if_services_are_bound_only_when_on():
    from serve.builder import build_application

    def services(cfg: AppConfig) -> set[str]:
        return set(build_application(cfg)._bound_deployment.init_kwargs)

    assert services(load_app_config(None, environ={})) == set()
    whatif = load_app_config(ROOT / "configs" / "whatif.yaml", environ={})
    assert whatif.session.whatif.safety_model.enabled and whatif.session.whatif.hop.enabled
    assert services(whatif) == {"hop", "safety_model"}
    env = {"RESPONSES_WS_SESSION__WHATIF__HOP__ENABLED": "true"}
    assert services(load_app_config(None, environ=env)) == {"hop"}


@pytest.mark.parametrize(
    ("name", "kind"), [("real-model.yaml", "openai"), ("real-model-serve-llm.yaml", "serve_llm")]
)
def test_the_real_model_configs_serve_smollm2_with_the_engines_prefix_cache(name, kind):
    """Both ways of serving the small model (docs/backends.md) load; the Ray Serve LLM one
    keeps vLLM's prefix cache and cached-token usage on, on CPU with a small KV cache."""
    cfg = load_app_config(ROOT / "configs" / name, environ={})
    (backend,) = cfg.session.backends
    assert (backend.id, backend.kind, backend.temperature) == ("smollm2-135m", kind, 0.0)
    assert Path(backend.tokenizer).expanduser().name == "smollm2-135m"
    if kind == "serve_llm":
        assert backend.accelerator == "cpu" and backend.engine_env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
        assert (
            backend.engine_kwargs["enable_prefix_caching"]
            and backend.engine_kwargs["enable_prompt_tokens_details"]
        )
        assert backend.url is None


def test_resume_is_off_by_default_and_in_every_shipped_config():
    """Resume writes ``store:false`` content to the cluster store: only an operator turns it
    on (docs/reliability.md, "Privacy")."""
    import yaml

    assert AppConfig().session.resume_grace_s == 0
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        sections = [app.get("args", {}) for app in raw.get("applications", [])] or [raw]
        for args in sections:
            assert not (args.get("session") or {}).get("resume_grace_s"), path.name


def test_the_session_tier_autoscales_unless_a_fixed_count_is_given():
    auto = {"gateway_autoscaling": {"min_replicas": 1, "max_replicas": 4}}
    assert app_config_from_dict({"server": auto}, environ={}).server.gateway_autoscaling is not None
    fixed = app_config_from_dict({"server": auto}, environ={"RESPONSES_WS_SERVER__GATEWAY_REPLICAS": "2"})
    assert fixed.server.gateway_autoscaling is None and fixed.server.gateway_replicas == 2
    with pytest.raises(ValueError, match="min_replicas must be <= max_replicas"):
        app_config_from_dict(
            {"server": {"gateway_autoscaling": {"min_replicas": 3, "max_replicas": 2}}}, environ={}
        )
