"""The ``bench``, ``demo`` and ``replay`` command lines of ``responses-ws`` (:mod:`serve.cli`
hands them over unparsed): pick the module (a kind of :data:`bench.KINDS` and its variant, an
alias of :data:`bench.ALIASES`, or
:mod:`bench.kinds.demo`, :mod:`bench.kinds.replay`),
build its parser, start the :class:`~bench.results.Run` its results record, run it.

Every one of them needs the lab's dependencies (bench/pyproject.toml): without them, the command
ends with a one-line install hint before anything runs, instead of a traceback (or a failure
after a long run).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shlex
import sys

from . import ALIASES, DEFAULT_KIND, DEMO_MODULE, KINDS, REPLAY_MODULE
from .results import Run

INSTALL_HINT = "pip install 'responses-ws[bench]' (from a checkout: pip install -e ./bench)"
# The import names of the lab's own dependencies besides the server, bench/pyproject.toml
# (tests/test_layout.py keeps them equal).
EXTRA_MODULES = frozenset(
    {"rich", "matplotlib", "psutil", "hypothesis", "httpx", "openai", "redis", "jsonschema"}
)


def main(argv: list[str]) -> int:
    """``argv`` starts with ``bench``, ``demo`` or ``replay``."""
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return run_module(DEMO_MODULE, "responses-ws demo", rest)
    if command == "replay":
        return run_module(REPLAY_MODULE, "responses-ws replay", rest)
    if rest[:1] and rest[0] in ("-h", "--help"):
        print(overview())
        return 0
    name, variant = DEFAULT_KIND, None
    if rest[:1] and not rest[0].startswith("-"):
        name, rest = rest[0], rest[1:]
        if name in ALIASES:
            name, variant = ALIASES[name]
        elif name not in KINDS:
            known = ", ".join([*KINDS, *ALIASES])
            print(f"responses-ws bench: unknown kind {name!r} (one of {known})", file=sys.stderr)
            return 2
    kind = KINDS[name]
    if variant is None and kind.variants:
        variant = kind.variants[0].name
        if rest[:1] and rest[0] in kind.variant_names:
            variant, rest = rest[0], rest[1:]
    if variant is None:
        return run_module(kind.module, f"responses-ws bench {name}", rest)
    prog = f"responses-ws bench {name}" + ("" if variant == kind.variants[0].name else f" {variant}")
    return run_module(kind.variant_module(variant), prog, rest)


def overview() -> str:
    width = max(map(len, [*KINDS, *ALIASES]))
    lines = [
        "usage: responses-ws bench [KIND [VARIANT]] [options]",
        "",
        f"kinds (without one: {DEFAULT_KIND}; responses-ws bench KIND [VARIANT] --help for its options):",
    ]
    for name, kind in KINDS.items():
        lines.append(f"  {name:<{width}}  {kind.summary}")
        lines += [
            f"  {'':<{width}}    {variant.name}{' (without a variant)' if i == 0 else ''}: {variant.summary}"
            for i, variant in enumerate(kind.variants)
        ]
    lines += ["", "aliases:"]
    lines += [f"  {alias:<{width}}  {kind} {variant}" for alias, (kind, variant) in ALIASES.items()]
    return "\n".join(lines)


def run_module(module: str, prog: str, argv: list[str]) -> int:
    missing = sorted(name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None)
    if missing:
        print(
            f"{prog} needs the lab's dependencies ({', '.join(missing)} not installed): {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 1
    mod = importlib.import_module(module)
    parser = argparse.ArgumentParser(
        prog=prog, description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mod.add_arguments(parser)
    args = parser.parse_args(argv)
    args.command = " ".join([prog, *map(shlex.quote, argv)])
    args.run = Run.start(args.command)
    return mod.run(args)
