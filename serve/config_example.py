"""``configs/server.example.yaml``, written from the config models: every key of
:class:`serve.config.AppConfig` with its default and, above it, its description.

    python -m serve.config_example > configs/server.example.yaml   # write it
    python -m serve.config_example --check configs/server.example.yaml  # exit 1 if stale

A key whose default is ``null`` or an empty list but whose value is a mapping of its own
(``server.gateway_autoscaling``, ``session.backends``) is followed by a commented-out
example of that mapping: ``#`` in the first column, every key at the column it would have,
the default (or ``<required>``) as its value and the description after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from .config import AppConfig

HEADER = """\
# Every key of `responses-ws serve --config FILE`, with its default (written by
# `python -m serve.config_example`; tests/serve/test_config_example.py fails when it is stale).
# Every section and key is optional. The same mapping is what a Serve config file passes as
# `args:` to serve.builder:app_builder. Sections merge at every depth with the defaults; a list
# or a scalar is replaced whole; later sources win key by key:
#   defaults < this file < RESPONSES_WS_<SECTION>__<KEY>=<yaml> in the environment
#   < --set section.key=<yaml> < --host/--port        (docs/operations.md, Configuration)
# The inference section's defaults, written out below, are the packaged models.yaml.
"""
WIDTH = 100
REQUIRED = "<required>"


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a section: its name, its type, its default and what it means."""

    name: str
    annotation: Any
    default: Any
    description: str


def keys_of(kind: type) -> list[Key]:
    """The keys of a pydantic model or a dataclass, in declaration order, with their defaults
    (:data:`REQUIRED` where there is none)."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        out = []
        for name, field in kind.model_fields.items():
            default = REQUIRED if field.is_required() else field.get_default(call_default_factory=True)
            out.append(Key(name, field.annotation, default, field.description or ""))
        return out
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return [
            Key(
                f.name,
                hints[f.name],
                REQUIRED if f.default is dataclasses.MISSING else f.default,
                f.metadata.get("description", ""),
            )
            for f in dataclasses.fields(kind)
        ]
    raise TypeError(f"{kind!r} is neither a pydantic model nor a dataclass")


def nested(annotation: Any) -> tuple[type | None, bool]:
    """The mapping type a key holds (a model or a dataclass), also inside ``X | None``,
    ``list[X]`` and ``tuple[X, ...]``, and whether it is a list of them."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        inner, _ = nested(typing.get_args(annotation)[0])
        return inner, inner is not None
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            inner, many = nested(arg)
            if inner is not None:
                return inner, many
        return None, False
    if origin is typing.Annotated:
        return nested(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
    ):
        return annotation, False
    return None, False


def plain(value: Any) -> Any:
    """A default as YAML writes it: models and dataclasses as mappings, tuples as lists."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def scalar(value: Any) -> str:
    """One value on one line, in YAML's flow style."""
    if value == REQUIRED:
        return REQUIRED
    text = yaml.safe_dump(plain(value), default_flow_style=True, width=1 << 20, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...")


def comment(text: str, indent: int) -> Iterator[str]:
    pad = " " * indent
    yield from textwrap.wrap(
        " ".join(text.split()), WIDTH, initial_indent=f"{pad}# ", subsequent_indent=f"{pad}# "
    )


def mapping(kind: type, value: Any, indent: int) -> Iterator[str]:
    """The keys of ``kind`` with the values ``value`` holds (its defaults where it is the
    type's default), each under its description."""
    for key in keys_of(kind):
        current = getattr(value, key.name) if value is not None else key.default
        yield from comment(key.description, indent)
        yield from entry(key, current, indent)


def entry(key: Key, current: Any, indent: int) -> Iterator[str]:
    pad = " " * indent
    inner, many = nested(key.annotation)
    if inner is None:
        yield f"{pad}{key.name}: {scalar(current)}"
        return
    if many and current:
        yield f"{pad}{key.name}:"
        for item in current:
            lines = list(mapping(inner, item, indent + 4))
            first = next(i for i, line in enumerate(lines) if not line.lstrip().startswith("#"))
            lines[first] = f"{pad}  - {lines[first][indent + 4 :]}"
            yield from (f"{pad}  {line.lstrip()}" for line in lines[:first])
            yield from lines[first:]
        return
    if current is not None and not many:
        yield f"{pad}{key.name}:"
        yield from mapping(inner, current, indent + 2)
        return
    yield f"{pad}{key.name}: {scalar(current)}"
    yield from commented_example(key.name, inner, many, indent)


def commented_example(name: str, kind: type, many: bool, indent: int) -> Iterator[str]:
    """An example of a mapping a key may hold, commented out column-true (``#`` in column 0)."""
    what = "an entry" if many else "when set"
    yield "#" + f"{' ' * (indent - 1)}{name}:  # {what}: every key, its default or {REQUIRED}"
    body = list(example_lines(kind, indent + (4 if many else 2)))
    if many:
        body[0] = f"{' ' * (indent + 2)}- {body[0][indent + 4 :]}"
    for line in body:
        yield "#" + line[1:]


def example_lines(kind: type, indent: int) -> Iterator[str]:
    pad = " " * indent
    for key in keys_of(kind):
        inner, many = nested(key.annotation)
        note = f"  # {' '.join(key.description.split())}" if key.description else ""
        if inner is None or key.default not in (REQUIRED, None, (), []):
            yield f"{pad}{key.name}: {scalar(key.default)}{note}"
            continue
        yield f"{pad}{key.name}:{note}"
        body = list(example_lines(inner, indent + (4 if many else 2)))
        if many:
            body[0] = f"{pad}  - {body[0][indent + 4 :]}"
        yield from body


def render(config: AppConfig | None = None) -> str:
    """The example file: ``config``'s values (the defaults when None), every key."""
    config = config if config is not None else AppConfig()
    lines = [HEADER.rstrip("\n")]
    for key in keys_of(AppConfig):
        lines.append("")
        lines.extend(comment(key.description, 0))
        lines.extend(entry(key, getattr(config, key.name), 0))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve.config_example", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--check", type=Path, metavar="FILE", help="exit 1 if FILE differs from what would be written"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.check is None:
        sys.stdout.write(text)
        return 0
    if args.check.read_text() == text:
        return 0
    print(f"{args.check} is stale: python -m serve.config_example > {args.check}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
