"""configs/server.example.yaml is what ``python -m serve.config_example`` writes, and it
names every key of the config models with its default and its description."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from serve.config import AppConfig, app_config_from_dict
from serve.config_example import main, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "server.example.yaml"


def model_keys(kind: Any, prefix: str = "") -> set[str]:
    """Every dotted key of a config model, also inside ``X | None`` and lists of models (the
    item's keys under ``key[]``), read from the models themselves."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType, list, tuple, typing.Annotated):
        many = prefix and origin in (list, tuple)
        return set().union(
            *(
                model_keys(arg, prefix + ("[]" if many else ""))
                for arg in typing.get_args(kind)
                if arg is not ...
            )
        )
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        fields = {name: f.annotation for name, f in kind.model_fields.items()}
    elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
        fields = typing.get_type_hints(kind)
    else:
        return set()
    out = set()
    for name, annotation in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        out |= {key} | model_keys(annotation, key)
    return out


KEY_LINE = re.compile(r"^( *)(- )?([A-Za-z_]\w*):(?: |$)")


def file_keys(text: str) -> set[str]:
    """The dotted keys a file names, set or commented out column-true (``#`` in column 0, the
    key at the column it would have); an item of a list adds ``[]`` to its key."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []  # (column, dotted key)
    for raw in text.splitlines():
        line = " " + raw[1:] if raw.startswith("#") else raw
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent, dash, name = len(match[1]), match[2], match[3]
        column = indent + (2 if dash else 0)
        while stack and stack[-1][0] >= (indent if dash else column):
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if dash:
            parent += "[]"
            stack.append((indent, parent))
        key = f"{parent}.{name}" if parent else name
        out.add(key)
        stack.append((column, key))
    return out


def test_the_file_is_what_the_generator_writes():
    assert EXAMPLE.read_text() == render(), (
        "stale: python -m serve.config_example > configs/server.example.yaml"
    )
    assert main(["--check", str(EXAMPLE)]) == 0


def test_check_fails_on_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "server.example.yaml"
    stale.write_text(render().replace("  max_inflight: 16\n", ""))
    assert main(["--check", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err


def test_every_key_of_the_models_is_in_the_file():
    keys = model_keys(AppConfig)
    assert {"store.redis_password_file", "store.redis_cluster", "store.wait_replicas"} <= keys
    assert {"session.backends[].tokenizer", "server.gateway_autoscaling.min_replicas"} <= keys
    assert sorted(keys - file_keys(EXAMPLE.read_text())) == []


def test_a_missing_key_is_noticed():
    text = render()
    assert "store.wait_replicas" in file_keys(text)
    assert "store.wait_replicas" not in file_keys(text.replace("  wait_replicas: null\n", ""))
    assert "session.backends[].url" not in file_keys(re.sub(r"(?m)^#     url: .*\n", "", text))


def test_every_key_has_a_description():
    text = render()
    undescribed = [
        line
        for previous, line in zip(text.splitlines(), text.splitlines()[1:], strict=False)
        if KEY_LINE.match(line) and not previous.lstrip().startswith("#") and not line.startswith("#")
    ]
    commented = [
        line for line in text.splitlines() if line.startswith("#") and KEY_LINE.match(" " + line[1:])
    ]
    assert undescribed == []
    assert [line for line in commented if "  # " not in line] == []


def test_the_file_loads_as_the_defaults():
    assert app_config_from_dict(yaml.safe_load(EXAMPLE.read_text()), environ={}) == app_config_from_dict(
        {}, environ={}
    )


def test_the_readmes_config_table_names_keys_that_exist():
    """README.md's table of the keys that matter most: every key it names is a key."""
    readme = (ROOT / "README.md").read_text()
    rows = [
        line for line in readme.splitlines() if re.match(r"\| `(server|session|store|inference|logs)\.", line)
    ]
    named = set()
    for row in rows:
        first = row.split("|")[1]
        keys = re.findall(r"`([\w.]+)`", first)
        section = keys[0].rsplit(".", 1)[0]
        named |= {key if "." in key else f"{section}.{key}" for key in keys}
    assert len(rows) > 10
    assert sorted(named - model_keys(AppConfig)) == []
