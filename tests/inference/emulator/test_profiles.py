"""profiles: typed config, shipped YAML, model lookup."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from inference.emulator.profiles import (
    InferenceConfig,
    ModelProfile,
    PolicyConfig,
    UnknownModelProfile,
    load_inference_config,
)


def test_shipped_config_has_a_fast_and_a_gpu_profile():
    cfg = load_inference_config()
    assert cfg.default_model == "emu-fast"
    fast, gpu = cfg.profile("emu-fast"), cfg.profile("emu-gpu")
    assert fast.decode_tokens_per_s == 1000 and fast.burst_tokens_per_s == 4000
    assert fast.burst_tokens > 0
    assert 50 <= gpu.decode_tokens_per_s <= 100
    assert gpu.burst_tokens == 0


def test_loading_an_explicit_path(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "default_model: a\n"
        "profiles:\n"
        "  - {id: a, decode_tokens_per_s: 10, prefill_tokens_per_s: 100, prefill_overhead_ms: 1}\n"
    )
    cfg = load_inference_config(path)
    assert cfg.policy == PolicyConfig()
    assert cfg.profile("a").chunk_ms == 5.0 and cfg.profile("a").min_chunk_tokens == 8


def test_unknown_model_raises_model_not_found(make_config):
    with pytest.raises(UnknownModelProfile) as info:
        make_config().profile("gpt-nope")
    assert info.value.model == "gpt-nope"
    assert "gpt-nope" in str(info.value)
    assert isinstance(info.value, LookupError)


def test_model_not_found_survives_pickling():
    # It crosses a Ray boundary when raised inside the deployment.
    err = pickle.loads(pickle.dumps(UnknownModelProfile("m")))
    assert isinstance(err, UnknownModelProfile) and err.model == "m"


def test_profile_ids_must_be_unique(make_profile):
    with pytest.raises(ValidationError, match="duplicate"):
        InferenceConfig(profiles=[make_profile(), make_profile()], default_model="emu-test")


def test_default_model_must_be_a_profile(make_profile):
    with pytest.raises(ValidationError, match="default_model"):
        InferenceConfig(profiles=[make_profile()], default_model="other")


def test_unknown_fields_are_rejected(make_profile):
    with pytest.raises(ValidationError):
        ModelProfile.model_validate({**make_profile().model_dump(), "tokens_per_s": 5})


def test_burst_tokens_need_a_burst_rate(make_profile):
    with pytest.raises(ValidationError, match="burst"):
        make_profile(burst_tokens=10)


def test_rates_must_be_positive(make_profile):
    with pytest.raises(ValidationError):
        make_profile(decode_tokens_per_s=0)


def test_a_deep_copy_of_the_config_can_be_adjusted_for_a_test_server():
    cfg = load_inference_config().model_copy(deep=True)
    cfg.policy.tool_rounds = 20
    assert cfg.policy.tool_rounds == 20
    assert load_inference_config().policy.tool_rounds == 3
