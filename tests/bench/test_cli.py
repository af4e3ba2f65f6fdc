"""``responses-ws bench [KIND]`` and ``responses-ws demo``: every kind has the module shape
bench/__init__.py documents, the default kind is agentloop, and a missing lab, or a lab
without its dependencies, ends the command with an install hint (no server is started here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import bench
from bench import ALIASES, DEFAULT_KIND, DEMO_MODULE, KINDS, REPLAY_MODULE
from bench.commands import INSTALL_HINT
from serve.cli import LAB_HINT, main


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_has_a_doc_options_and_a_run(kind, capsys):
    module = importlib.import_module(KINDS[kind].module)
    assert module.__doc__ and callable(module.add_arguments) and callable(module.run)
    with pytest.raises(SystemExit) as done:
        main(["bench", kind, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: responses-ws bench {kind} ")


def test_the_overview_lists_every_kind(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {kind} " in out for kind in [*KINDS, *ALIASES])
    assert all(f"    {v.name}" in out for kind in KINDS.values() for v in kind.variants)


def test_without_a_kind_bench_runs_agentloop(capsys):
    assert DEFAULT_KIND == "agentloop"
    with pytest.raises(SystemExit):
        main(["bench", "--rollouts", "3", "--help"])
    assert capsys.readouterr().out.startswith("usage: responses-ws bench agentloop ")


def test_an_unknown_kind_is_refused(capsys):
    assert main(["bench", "nope"]) == 2
    assert "unknown kind 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "hotpath"], ["demo"], ["replay", "session.jsonl"]])
def test_without_the_lab_the_server_cli_prints_how_to_install_it(argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "bench", None)  # as if responses-ws-bench were not installed
    monkeypatch.delitem(sys.modules, "bench.commands", raising=False)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "responses-ws-bench" in err and LAB_HINT in err


@pytest.mark.parametrize("argv", [["bench", "hotpath"], ["demo"], ["replay", "session.jsonl"]])
def test_without_the_labs_dependencies_the_command_prints_an_install_hint(argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "psutil", None)  # as if it were not installed
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "psutil" in err and INSTALL_HINT in err


VARIANTS = [(name, v.name) for name, kind in KINDS.items() for v in kind.variants[1:]]


@pytest.mark.parametrize(("kind", "variant"), VARIANTS)
def test_every_variant_has_a_doc_options_and_a_run(kind, variant, capsys):
    module = importlib.import_module(KINDS[kind].variant_module(variant))
    assert module.__name__ == f"bench.kinds.{kind}_{variant}"
    assert module.__doc__ and callable(module.add_arguments) and callable(module.run)
    with pytest.raises(SystemExit) as done:
        main(["bench", kind, variant, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: responses-ws bench {kind} {variant} ")
    assert module.__doc__.strip().splitlines()[0] in out


def test_without_a_variant_a_kind_runs_its_first():
    assert KINDS["floor"].variant_module("reference") == KINDS["floor"].module == "bench.kinds.floor"
    assert KINDS["ledger"].variant_module("hosts") == "bench.kinds.ledger"
    with pytest.raises(KeyError):
        KINDS["floor"].variant_module("nope")


@pytest.mark.parametrize(("alias", "target"), sorted(ALIASES.items()))
def test_an_alias_runs_its_variant(alias, target, capsys):
    kind, variant = target
    with pytest.raises(SystemExit):
        main(["bench", alias, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: responses-ws bench {kind} {variant} ")
    assert alias not in KINDS


def test_every_kind_is_the_module_named_after_it_and_every_module_there_is_a_command(capsys):
    kinds_dir = Path(bench.__file__).parent / "kinds"
    modules = {p.stem for p in kinds_dir.glob("*.py")} - {"__init__"}
    assert modules == set(KINDS) | {f"{kind}_{variant}" for kind, variant in VARIANTS} | {"demo", "replay"}
    assert DEMO_MODULE == "bench.kinds.demo" and REPLAY_MODULE == "bench.kinds.replay"
    for name, kind in KINDS.items():
        assert kind.module == f"bench.kinds.{name}"
        with pytest.raises(SystemExit):
            main(["bench", name, "--help"])
        first_line = importlib.import_module(kind.module).__doc__.strip().splitlines()[0]
        assert first_line in capsys.readouterr().out, name  # the CLI ran that module


def test_replay_runs_its_module(capsys):
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    first_line = importlib.import_module(REPLAY_MODULE).__doc__.strip().splitlines()[0]
    assert first_line in capsys.readouterr().out
