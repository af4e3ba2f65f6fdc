"""The Ray Serve LLM deployments of ``serve_llm`` backends (docs/backends.md).

One ``ray.serve.llm`` deployment (vLLM engine) per backend, named ``LLMServer:<id>`` in
this application; session hosts call it through its handle
(:mod:`actors.backend.serve_llm_client`).  ``ray.serve.llm`` (and vLLM, pyarrow) are imported only
here and only when a config has such a backend: the `real-model` extra, not the default
install.
"""

from __future__ import annotations

import os
from typing import Any

from ray.serve import Application

from actors.config import ModelBackend


def llm_config(backend: ModelBackend) -> Any:
    """The backend as ``ray.serve.llm.LLMConfig``: its weights under the engine's model
    name, on CPU or GPU, vLLM's engine arguments, its replica's environment."""
    from ray.serve.llm import LLMConfig

    source = os.path.expanduser(backend.model_source or backend.tokenizer)
    return LLMConfig(
        model_loading_config={"model_id": backend.served_name, "model_source": source},
        accelerator_config={"kind": backend.accelerator},
        engine_kwargs=dict(backend.engine_kwargs),
        deployment_config={"num_replicas": backend.replicas},
        runtime_env={"env_vars": dict(backend.engine_env)} if backend.engine_env else None,
    )


def llm_deployment(backend: ModelBackend) -> Application:
    from ray.serve.llm import build_llm_deployment

    return build_llm_deployment(llm_config(backend), override_serve_options={"name": backend.deployment})
