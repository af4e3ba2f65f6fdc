"""The package layout's rules, stated here once (module docstrings do not restate them):

- dependency direction ``serve → actors → inference``; ``store`` is used by ``serve`` and
  ``actors`` and imports neither (:data:`ALLOWED`);
- ``bench`` is the lab, a client of the server and a distribution of its own
  (bench/pyproject.toml): no server module imports it (the CLI's ``bench``, ``demo`` and
  ``replay`` load it by name when it is installed), and the server's wheel does not hold it;
  of the lab's modules only the fuzz benchmark imports hypothesis (:data:`FUZZ_BENCHMARK`);
  ``investigations`` (run from a checkout, never in the wheel) may import all of them;
- the session core (``actors/core``) imports only the typed seam (:data:`CORE_MAY_IMPORT`);
- ``inference``'s own modules are the seam every backend shares; the emulated backend is the
  package :data:`EMULATOR`, which no module of the seam imports;
- only the modules of :data:`RAY_MODULES` import Ray;
- only the modules of :data:`PRIVATE_IMPORTS_ALLOWED` import a private module of Ray or
  websockets, and no product module reaches into a private name of a library or of another
  module;
- the server uses only websockets' documented sans-I/O API (:data:`WEBSOCKETS_API`);
- ``actors.core.driver`` is the only caller of ``Session.handle`` (:data:`SESSION_DRIVER`);
- no import cycles.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["inference", "store", "actors", "serve", "bench", "investigations"]
# package → the project packages it may import
ALLOWED = {
    "inference": set(),
    "store": set(),
    "actors": {"inference", "store"},
    "serve": {"actors", "inference", "store"},
    "bench": {"serve", "actors", "inference", "store"},
    "investigations": {
        "bench",
        "serve",
        "actors",
        "inference",
        "store",
    },  # run from a checkout, not in the wheel
}
RAY_MODULES = {
    "inference/emulator/deployment.py",
    "inference/emulator/whatif_deployment.py",
    "inference/serve_autoscaling.py",  # every use of Serve's custom autoscaling metrics and policies
    "actors/backend/ray_serve.py",
    "actors/host/actor.py",
    "actors/host/host_metrics.py",
    "serve/gateway.py",
    "serve/builder.py",
    "serve/embedded.py",
    "serve/log_settings.py",
    "serve/gateway_metrics.py",
    "serve/balancer_sync.py",  # Serve's REST client (as `serve status`), imported where used
    "serve/ray_drain.py",  # every use of Ray's unstable drain interfaces
    "actors/backend/serve_llm_client.py",
    "serve/serve_llm.py",
}  # the last two: Ray Serve LLM
FUZZ_BENCHMARK = {"bench.kinds.fuzz", "bench.fuzz_cases"}  # the only installed modules that import hypothesis


def tree(path: Path) -> ast.Module:
    """``path`` parsed (once for each text the session reads: the rules below walk the same
    modules many times).  The trees are shared: no rule changes them."""
    return _parsed(path.read_text())


def walk(path: Path) -> tuple[ast.AST, ...]:
    """Every node of :func:`tree`, in :func:`ast.walk`'s order."""
    return _walked(path.read_text())


@functools.cache
def _parsed(text: str) -> ast.Module:
    return ast.parse(text)


@functools.cache
def _walked(text: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_parsed(text)))


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    module = tree(path)
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    nodes = module.body if top_level_only else walk(path)
    if top_level_only:  # also imports under a top-level if/try (not inside functions)
        nodes = [
            n
            for stmt in module.body
            for n in ast.walk(stmt)
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names.add(mod)
            names |= {f"{mod}.{a.name}" for a in node.names}
    return names


def packages_of(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names} & set(PACKAGES)


def test_packages_import_only_what_they_may():
    for package in PACKAGES:
        for path in modules(package):
            rel = path.relative_to(ROOT).as_posix()
            used = packages_of(imported(path)) - {package}
            assert used <= ALLOWED[package], f"{rel} imports {used - ALLOWED[package]}"


# What the session core (actors/core) may import of the project: itself, the wire protocol
# and the shared modules beside it, the typed seam of inference, and the store's records.
# Never the host that drives it, the backends behind the seam, or the emulator.
CORE_MAY_IMPORT = (
    "actors.core",
    "actors.protocol",
    "actors.config",
    "actors.errors",
    "actors.ids",
    "inference.types",
    "inference.formats",
)
CORE_MAY_IMPORT_FROM_STORE = {"store", "store.StoredResponse", "store.UsageEntry"}  # its records


def test_the_session_core_imports_only_the_typed_seam():
    wrong = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules("actors/core")
        for name in imported(path)
        if name.split(".")[0] in PACKAGES
        and not any(name == ok or name.startswith(ok + ".") for ok in CORE_MAY_IMPORT)
        and name not in CORE_MAY_IMPORT_FROM_STORE
    }
    assert not wrong, sorted(wrong)


# inference/ holds the seam the session and every backend share (the request and event types,
# the tokenizer, the chat formats, the direct channel, routing, Serve's custom autoscaling);
# the emulated backend is a package of its own inside it, which the seam never imports: a real
# backend runs on the seam alone.
EMULATOR = "inference.emulator"


def test_the_inference_seam_does_not_import_the_emulator():
    emulator = [p for p in modules("inference") if module_name(p).startswith(EMULATOR)]
    seam = [p for p in modules("inference") if p not in emulator]
    assert emulator and seam, "inference/ has no emulator package or no seam: move this test with them"
    wrong = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in seam
        for name in imported(path)
        if name == EMULATOR or name.startswith(EMULATOR + ".")
    }
    assert not wrong, sorted(wrong)


# The names of websockets the server uses: its documented sans-I/O API, no connection class
# to subclass and no private method (actors/host/websocket.py drives ServerProtocol).
WEBSOCKETS_API = {
    "websockets.datastructures.Headers",
    "websockets.exceptions.ConnectionClosed",
    "websockets.extensions.permessage_deflate.ServerPerMessageDeflateFactory",
    "websockets.frames.CloseCode",
    "websockets.frames.Frame",
    "websockets.frames.Opcode",
    "websockets.http11.Request",
    "websockets.http11.Response",
    "websockets.protocol.State",
    "websockets.server.ServerProtocol",
    "websockets.typing.Subprotocol",
}


def test_the_server_uses_only_the_public_sans_io_api_of_websockets():
    allowed = WEBSOCKETS_API | {name.rsplit(".", 1)[0] for name in WEBSOCKETS_API}  # and their modules
    used = {
        f"{path.relative_to(ROOT)}: {name}"
        for package in ("inference", "store", "actors", "serve")
        for path in modules(package)
        for name in imported(path)
        if name.split(".")[0] == "websockets" and name not in allowed
    }
    assert not used, sorted(used)


def test_only_the_fuzz_benchmark_imports_hypothesis():
    """At import time, directly or through another module: hypothesis is not a dependency of
    the server, nor of the other benchmarks (the fuzz oracle included)."""
    for package in PACKAGES:
        for path in modules(package):
            name = module_name(path)
            if name in FUZZ_BENCHMARK:
                continue
            top = imported(path, top_level_only=True)
            assert not any(n == "hypothesis" or n.startswith("hypothesis.") for n in top), name
            assert not top & FUZZ_BENCHMARK, f"{name} imports {top & FUZZ_BENCHMARK}"


def test_importing_the_cli_loads_neither_bench_nor_hypothesis():
    code = (
        "import sys, serve.cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'bench', 'hypothesis', 'rich', 'httpx'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


LAB = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())


def test_the_labs_dependencies_are_what_the_bench_command_checks_for():
    from bench.commands import EXTRA_MODULES

    names = {re.match(r"[\w.-]+", requirement).group() for requirement in LAB["project"]["dependencies"]}
    assert names - {"responses-ws"} == EXTRA_MODULES


def test_the_lab_is_a_distribution_of_its_own_released_with_the_server():
    """The server's wheel holds the server's packages only; its ``bench`` extra is the lab, of
    the server's version, and the lab requires that same server (it is released with it)."""
    from fnmatch import fnmatch

    server = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = server["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(fnmatch(name, pattern) for name in ("bench", "bench.kinds") for pattern in include)
    version = server["project"]["version"]
    assert LAB["project"]["version"] == version
    assert server["project"]["optional-dependencies"]["bench"] == [f"responses-ws-bench=={version}"]
    assert f"responses-ws=={version}" in LAB["project"]["dependencies"]
    lab = LAB["tool"]["setuptools"]
    assert lab["package-dir"] == {"bench": "."}
    on_disk = {module_name(p.parent / "__init__.py") for p in (ROOT / "bench").rglob("__init__.py")}
    assert set(lab["packages"]) == on_disk, "every package of the lab is listed in bench/pyproject.toml"


def test_no_import_cycles():
    """Module-level imports between the project's modules form no cycle."""
    paths = {module_name(p): p for package in PACKAGES for p in modules(package)}
    graph = {
        name: {m for m in imported(p, top_level_only=True) if m in paths and m != name}
        for name, p in paths.items()
    }
    # A package imports its own submodules through its __init__: that is not a cycle.
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_only_designated_modules_import_ray():
    for package in SERVER_PACKAGES:
        for path in modules(package):
            rel = path.relative_to(ROOT).as_posix()
            if any(n == "ray" or n.startswith("ray.") for n in imported(path)):
                assert rel in RAY_MODULES, f"{rel} imports ray"


# The libraries whose private modules (and names) no product module may import: a minor
# release may change them without notice.
GUARDED = ("ray", "websockets")  # ray.serve is under ray
# module → why it may: a deliberate wrapper of internals with no public equivalent, pinned and
# tested on its own.
PRIVATE_IMPORTS_ALLOWED = {
    "bench/ray_internals.py": "the benchmarks' Ray internals, checked against the pinned Ray",
    "serve/ray_drain.py": "Ray's drain interfaces (no public API in 2.60), pinned to the Ray series "
    "and tested on a real drain (tests/cluster/test_ray_drain.py)",
}


def private_imports(path: Path) -> set[str]:
    """The names ``path`` imports from a guarded library with an underscore-prefixed part
    (``ray._private.state``, ``ray.serve._private.api``; dunders such as ``__version__`` aside)."""
    return {
        name
        for name in imported(path)
        if name.split(".")[0] in GUARDED
        and any(part.startswith("_") and not part.endswith("__") for part in name.split("."))
    }


def test_no_product_module_imports_a_private_module_of_ray_serve_or_websockets():
    offenders = {
        rel: sorted(names)
        for package in PACKAGES
        for path in modules(package)
        if (rel := path.relative_to(ROOT).as_posix()) not in PRIVATE_IMPORTS_ALLOWED
        and (names := private_imports(path))
    }
    assert not offenders, f"private modules imported: {offenders}"
    for rel in PRIVATE_IMPORTS_ALLOWED:  # no stale entry
        assert private_imports(ROOT / rel), f"{rel} imports nothing private: drop its entry"


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.endswith("__")


def private_reach_ins(path: Path) -> list[str]:
    """``x._name`` (or ``getattr(x, "_name")``) where ``x`` is not ``self`` or ``cls`` and
    ``_name`` is not bound in the module itself, and ``super()._name``: a private method or
    attribute of an object of a library (``counter._record``), a base class's or another
    module's."""
    nodes = walk(path)
    bound = {n.name for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    bound |= {n.attr for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    bound |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    found = []
    for node in nodes:
        if isinstance(node, ast.Attribute) and _private(node.attr):
            on_super = isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "super"
            mine = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if on_super or (node.attr not in bound and not mine):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and _private(node.args[1].value)
            and node.args[1].value not in bound
        ):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_product_module_uses_a_private_name_of_a_library_or_another_module():
    offenders = [
        hit
        for package in SERVER_PACKAGES
        for path in modules(package)
        if path.relative_to(ROOT).as_posix() not in PRIVATE_IMPORTS_ALLOWED
        for hit in private_reach_ins(path)
    ]
    assert not offenders, f"private names of other objects used: {offenders}"


def test_a_private_reach_in_is_caught(tmp_path):
    module = tmp_path / "metrics.py"
    module.write_text(
        "class Mine:\n"
        "    def __init__(self):\n        self._n = 0\n"
        "    def _bump(self, other):\n        other._n += 1\n        return self._n\n"
        "    def _get_help_string(self, a):\n        return super()._get_help_string(a)\n"
        "def zero(counter, context):\n"
        "    counter._record(0)\n"
        "    return getattr(context, '_deployment_config', None), Mine()._bump(Mine())\n"
    )
    assert {hit.split(" ", 1)[1] for hit in private_reach_ins(module)} == {
        "super()._get_help_string",
        "counter._record",
        "getattr(context, '_deployment_config', None)",
    }


def _is_deployment_bind(node: ast.AST) -> bool:
    """``Deployment.bind(...)`` or ``Deployment.options(...).bind(...)`` (not ``socket.bind``)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bind"):
        return False
    target = node.func.value
    if isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute):
        return target.func.attr == "options"
    return isinstance(target, ast.Name) and target.id[:1].isupper()


def test_the_app_builder_is_the_only_bind_site():
    for package in PACKAGES:
        for path in modules(package):
            binds = [n for n in walk(path) if _is_deployment_bind(n)]
            assert not binds or path.relative_to(ROOT).as_posix() == "serve/builder.py", path


def test_the_project_cites_only_its_own_files():
    """Code, configs and docs stand alone: no reference to files outside the repository."""
    offenders = []
    for path in [*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("configs/*")]:
        offenders += [path] if "shared/" in path.read_text() or "design.md" in path.read_text() else []
    for package in PACKAGES:
        for path in modules(package):
            text = path.read_text()
            offenders += [path] if "shared/" in text or "design.md" in text else []
    assert not offenders, [str(p.relative_to(ROOT)) for p in offenders]


# ------------------------------------------------------------------ declared dependencies

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SERVER_PACKAGES = ["inference", "store", "actors", "serve"]
# Imported but not declared: pydantic pins its exact pydantic-core, so declaring it again
# adds nothing.
PROVIDED_BY = {"pydantic_core": "pydantic"}
# Imported only where a real model is configured (docs/backends.md), from the real-model
# extra: lazily, inside functions, and not installed by the default `make install`.
REAL_MODEL_IMPORTS = {"transformers"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(requirements: list[str]) -> set[str]:
    return {_canonical(re.match(r"[\w.-]+", r).group()) for r in requirements}


def third_party_imports(paths: list[Path]) -> set[str]:
    project = set(PACKAGES) | {"tests"}
    names = {n.split(".")[0] for path in paths for n in imported(path)}
    return {n for n in names if n not in sys.stdlib_module_names and n not in project and n != "__future__"}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return metadata.packages_distributions()  # what is installed: read once a run


def distributions(import_names: set[str]) -> set[str]:
    by_import = _installed()
    dists = set()
    for name in import_names:
        if name in PROVIDED_BY:
            continue
        assert name in by_import, f"{name} is imported but no installed distribution provides it"
        dists |= {_canonical(d) for d in by_import[name]}
    return dists


def test_the_server_declares_every_package_it_imports():
    """fastapi, uvicorn, starlette arrive with ray[serve] too, but the server imports them itself."""
    paths = [p for package in SERVER_PACKAGES for p in modules(package)]
    missing = distributions(third_party_imports(paths) - REAL_MODEL_IMPORTS) - _declared(
        PYPROJECT["dependencies"]
    )
    assert not missing, f"imported by the server but not in [project] dependencies: {sorted(missing)}"


def test_the_real_model_extra_declares_its_lazy_imports():
    assert _declared(PYPROJECT["optional-dependencies"]["real-model"]) >= REAL_MODEL_IMPORTS
    for package in SERVER_PACKAGES:
        for path in modules(package):
            top = {n.split(".")[0] for n in imported(path, top_level_only=True)}
            assert not top & REAL_MODEL_IMPORTS, (
                f"{path.relative_to(ROOT)} imports {top & REAL_MODEL_IMPORTS} at import time"
            )


def test_each_extra_declares_what_its_commands_and_tests_import():
    extras = PYPROJECT["optional-dependencies"]
    base = _declared(PYPROJECT["dependencies"])
    bench = base | _declared(LAB["project"]["dependencies"])
    test = bench | _declared(extras["test"])
    assert "responses-ws[bench]" in extras["demo"] and "responses-ws[bench]" in extras["test"]
    missing = distributions(third_party_imports(modules("bench"))) - bench
    assert not missing, f"bench imports {sorted(missing)}: add them to bench/pyproject.toml's dependencies"
    missing = distributions(third_party_imports(sorted((ROOT / "tests").rglob("*.py")))) - test
    assert not missing, f"the tests import {sorted(missing)}: add them to the test extra"


def test_the_default_model_profiles_are_package_data():
    """Shipped inside the inference package (a wheel has no configs/ directory)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "models.yaml" in setuptools["package-data"]["inference.emulator"]
    assert (ROOT / "inference" / "emulator" / "models.yaml").is_file()
    assert not (ROOT / "configs" / "models.yaml").exists(), "one copy only: inference/emulator/models.yaml"
    from inference.emulator.profiles import DEFAULT_CONFIG, load_inference_config

    assert DEFAULT_CONFIG.is_file() and load_inference_config().default_model == "emu-fast"


def test_the_package_metadata_is_complete():
    assert (
        PYPROJECT["license"] == "Apache-2.0" and (ROOT / "LICENSE").read_text().count("Apache License") >= 1
    )
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    assert PYPROJECT["requires-python"] == ">=3.11"
    assert PYPROJECT["authors"] and PYPROJECT["keywords"]
    versions = {
        c.rsplit(" ", 1)[-1]
        for c in PYPROJECT["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    }
    assert versions == {"3.11", "3.12", "3.13"}


def test_no_tracked_file_is_over_one_mebibyte():
    """Source only: no wheel, archive or build output; measurement data stays small."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    sizes = {
        name: (ROOT / name).stat().st_size
        for name in tracked.decode().split("\0")
        if name and (ROOT / name).is_file()
    }
    assert sizes, "git ls-files listed nothing"
    assert not {n: s for n, s in sizes.items() if s > 1 << 20}


def test_the_investigations_stay_out_of_the_wheel():
    from fnmatch import fnmatch

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not any(fnmatch("investigations", pattern) for pattern in include["include"])


# ------------------------------------------------------------------ the lab drives the server from outside

# What the lab may import of the server: its documented public surface — the embedded-server
# entry point and the typed config (docs/operations.md), and the emulated hardware's public
# modules, the model a client measures against (docs/emulator.md, "Public modules"): the
# profiles, the latency model, the tokenizer and the chat format.  Anything else is an
# internal: what measures one in-process belongs to the product's own tests or
# ``investigations/``, not to the lab.
LAB_PUBLIC = {
    "serve.embedded",
    "serve.config",
    "inference.emulator.profiles",
    "inference.emulator.pacing",
    "inference.tokenizer",
    "inference.chat_format",
    "store.state_reader",  # a connection's resumable state, read with its token (docs/reliability.md)
}


def imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports from (``from X import y`` → ``X``), absolute ones only."""
    names: set[str] = set()
    for node in walk(path):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
            if (ROOT / node.module.replace(".", "/")).is_dir():  # ``from inference import chat_format``
                names |= {f"{node.module}.{a.name}" for a in node.names}
                names.discard(node.module)
    return names


def server_internals(path: Path) -> set[str]:
    """The modules of the server ``path`` imports that are not its public surface."""
    return {m for m in imported_modules(path) if m.split(".")[0] in SERVER_PACKAGES and m not in LAB_PUBLIC}


def test_the_lab_imports_of_the_server_only_its_public_surface():
    used = {
        rel: sorted(m) for path in modules("bench") if (m := server_internals(path)) and (rel := str(path))
    }
    assert not used, f"the lab imports server internals (use the public surface): {used}"


def test_an_internal_import_in_the_lab_is_caught(tmp_path):
    lab_module = tmp_path / "kind.py"
    lab_module.write_text(
        "from serve.embedded import embedded_server\n"
        "from inference import chat_format\nfrom inference.emulator import pacing, policy\n"
        "def f():\n    from actors.core.session import Session\n    import store.redis\n"
    )
    assert server_internals(lab_module) == {"inference.emulator.policy", "actors.core.session", "store.redis"}


# The one way out of the session core: actors.core.driver.Driver hands a session its inputs
# and carries out what it answers; no other product module calls ``handle``.
SESSION_DRIVER = "actors/core/driver.py"


def handle_calls(path: Path) -> list[str]:
    """Every ``x.handle(...)`` call in ``path``."""
    return [
        f"{path.relative_to(ROOT).as_posix()}:{node.lineno} {ast.unparse(node.func)}"
        for node in walk(path)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "handle"
    ]


def test_the_driver_is_the_only_caller_of_a_sessions_handle():
    calls = {
        call
        for package in SERVER_PACKAGES
        for path in modules(package)
        if path.relative_to(ROOT).as_posix() != SESSION_DRIVER
        for call in handle_calls(path)
    }
    assert not calls, f"Session.handle called outside {SESSION_DRIVER}: {sorted(calls)}"
    assert handle_calls(ROOT / SESSION_DRIVER), "the driver no longer calls handle: move this test with it"


# The lab keeps one WebSocket client (bench/client.py): no other lab module opens a connection
# with websockets itself (catching websockets' exception types is fine).
WEBSOCKET_CLIENT = "bench/client.py"
OWN_SOCKETS = {
    "bench/fuzz_oracle.py": "sends raw bytes and invalid UTF-8 over a synchronous socket on purpose",
    "bench/report/browser.py": "speaks Chromium's DevTools protocol, not the Responses API",
}
CLIENT_MODULES = (
    "websockets.client",
    "websockets.asyncio.client",
    "websockets.sync.client",
    "websockets.legacy.client",
)


def websocket_connects(path: Path) -> set[str]:
    """The ways ``path`` opens a WebSocket with websockets itself: ``websockets.connect``
    called, ``connect`` imported from websockets, or one of its client modules imported."""
    found: set[str] = set()
    for node in walk(path):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(CLIENT_MODULES)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "websockets":
            if node.module.startswith(CLIENT_MODULES):
                found.add(node.module)
            found |= {f"{node.module}.connect" for a in node.names if a.name == "connect"}
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "connect"
            and ast.unparse(node.value).startswith("websockets")
        ):
            found.add(f"{ast.unparse(node.value)}.connect")
    return found


def test_the_lab_opens_websockets_only_through_its_one_client():
    own = {
        rel: sorted(found)
        for path in modules("bench")
        if (rel := path.relative_to(ROOT).as_posix()) not in {WEBSOCKET_CLIENT, *OWN_SOCKETS}
        and (found := websocket_connects(path))
    }
    assert not own, f"open WebSockets through bench.client.connect: {own}"


def test_a_websocket_opened_around_the_one_client_is_caught(tmp_path):
    lab_module = tmp_path / "kind.py"
    lab_module.write_text(
        "import websockets\nfrom websockets.exceptions import ConnectionClosed\n"
        "from websockets.sync.client import connect\n"
        "async def f(url):\n    return await websockets.connect(url)\n"
        "def g():\n    import websockets.asyncio.client\n"
    )
    assert websocket_connects(lab_module) == {
        "websockets.sync.client",
        "websockets.sync.client.connect",
        "websockets.connect",
        "websockets.asyncio.client",
    }
