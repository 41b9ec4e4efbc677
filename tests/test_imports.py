"""Imports point one way and never close a circle.

The graph is read from each module's source (ast) and holds every import: top-level ones, those
under `if TYPE_CHECKING:` and those inside functions. A circle through a type-only or a lazy
import is still a circle in the design: laziness defers loading, it does not make a dependency
point one way.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import tomllib

# The card's folders, installed as sub-packages of `baton` (pyproject.toml's package-dir).
LAYERS = ("app", "core", "gpu", "kernels", "tools")
PACKAGES = tuple(f"baton.{layer}" for layer in LAYERS)
WEB_STACK = ("starlette", "uvicorn", "websockets")
# What a layer must never import, not even lazily.
FORBIDDEN = {
    "core": ("torch", "triton", *WEB_STACK, "app", "gpu", "kernels", "tools"),
    "gpu": (*WEB_STACK, "app"),
    "kernels": (*WEB_STACK, "app", "gpu", "tools"),
}
# Offline tools a server never needs.
OFFLINE_TOOLS = (
    "baton.tools.train_demo",
    "baton.tools.random_checkpoint",
    "baton.tools.tokenizer_trainer",
)
REPO = Path(__file__).resolve().parent.parent


def layer(name: str) -> str:
    """The layer a dotted name belongs to: `baton.core.engine` -> core, `torch.nn` -> torch."""
    parts = name.split(".")
    return parts[1] if parts[0] == "baton" and len(parts) > 1 else parts[0]


@cache
def package_modules() -> dict[str, Path]:
    """Every module of PACKAGES by dotted name, with its source file."""
    found = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        found[name] = Path(package.__file__)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            spec = info.module_finder.find_spec(info.name, None)
            found[info.name] = Path(spec.origin)
    return found


@cache
def imported_names(module: str) -> frozenset[str]:
    """The dotted names `module` imports anywhere in it: `from x import y` gives `x` and `x.y`
    (which may be a module)."""
    path = package_modules()[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{parent}.{base}" if base else parent
        names.add(base)
        names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


def resolve(name: str) -> str | None:
    """The module of PACKAGES that importing `name` runs last: its longest known prefix."""
    modules = package_modules()
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports."""
    graph = {}
    for module in package_modules():
        targets = {resolve(name) for name in imported_names(module)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each is a tangle of
    circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def circle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest path from the component's first module back to itself, within it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    next_frontier.append(target)
        frontier = next_frontier
    raise AssertionError(f"{sorted(component)} is strongly connected but has no circle")


def describe(graph: dict[str, set[str]], tangle: set[str]) -> str:
    """The tangle's shortest circle, and the other modules tangled with it."""
    circle = circle_through(graph, tangle)
    others = sorted(tangle - set(circle))
    return " -> ".join(circle) + (f" (tangled with {', '.join(others)})" if others else "")


def test_circles_are_found_and_named() -> None:
    graph = {"a": {"b", "e"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"c"}, "f": {"d"}}

    found = tangles(graph)

    assert found == [{"a", "b", "c", "e"}]
    assert describe(graph, found[0]) == "a -> b -> c -> a (tangled with e)"
    assert tangles({"a": {"b"}, "b": set()}) == []


def test_an_imported_submodule_resolves_to_itself_not_its_package() -> None:
    # `from baton.kernels import ops` names the module baton.kernels.ops, not the package.
    assert resolve("baton.kernels.ops") == "baton.kernels.ops"
    assert resolve("baton.kernels.ops.paged_attention") == "baton.kernels.ops"
    assert resolve("torch.nn") is None
    assert "baton.kernels.ops" in import_graph()["baton.gpu.models.model"]


def test_no_import_circle_among_app_core_gpu_and_kernels() -> None:
    graph = import_graph()

    found = tangles(graph)

    assert not found, "import circles:\n" + "\n".join(describe(graph, t) for t in found)


def test_each_package_imports_only_what_lies_below_it() -> None:
    wrong = []
    for module in package_modules():
        forbidden = FORBIDDEN.get(layer(module), ())
        for name in sorted(imported_names(module)):
            if layer(name) in forbidden:
                wrong.append(f"{module} imports {name}")

    assert not wrong, "\n".join(wrong)


def loaded_after_importing(*modules: str) -> set[str]:
    """The names in sys.modules of a fresh interpreter after importing `modules`."""
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(' '.join(sys.modules))"
    root = Path(__file__).parent.parent
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_importing_core_loads_neither_torch_nor_the_web_stack() -> None:
    core_modules = [m for m in package_modules() if layer(m) == "core"]

    loaded = loaded_after_importing(*core_modules)

    assert "baton.core.engine" in loaded
    roots = {name.partition(".")[0] for name in loaded}
    assert roots.isdisjoint({"torch", "triton", *WEB_STACK})


def test_a_server_import_loads_no_offline_tool() -> None:
    loaded = loaded_after_importing("baton.app.http.server", "baton.app.cli", "baton.gpu.executor")

    assert "baton.gpu.executor" in loaded
    assert loaded.isdisjoint(OFFLINE_TOOLS)


# Loaded by a CPU server only once a request needs them: structured output (xgrammar, and the
# transformers tokenizer it reads the vocabulary with), tracing (opentelemetry), CUDA (triton);
# never: torch's compiler and what it pulls in (sympy), torch's extension builder (setuptools).
LAZY = ("xgrammar", "transformers", "opentelemetry", "triton", "sympy", "setuptools")
SERVE_THEN_CONSTRAIN = """
import json, sys
from baton.app.engine.async_engine import AsyncEngine
from baton.app.model_settings import DEMO_MODEL
from baton.app.llm import LLM
from baton.app.http.server import create_app
from baton.app.settings import ServerSettings
from baton.app.state import ServerState
from baton.core.sampling_params import SamplingParams
from baton.core.structured_output import GuideKind, StructuredOutput

def roots():
    return sorted({name.partition(".")[0] for name in sys.modules})

llm = LLM(DEMO_MODEL, device="cpu", max_num_seqs=4, num_kv_blocks=64)
create_app(ServerState(AsyncEngine(llm.engine, 8), llm.tokenizer, "demo", ServerSettings()))
plain = llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0))[0]
served = roots()
digits = StructuredOutput(GuideKind.REGEX, "[0-9]{3}")
constrained = llm.generate("Hello", SamplingParams(max_tokens=8, structured_output=digits))[0]
print(json.dumps([served, len(plain.token_ids), constrained.text, roots()]))
"""


@pytest.mark.slow
def test_a_cpu_server_loads_xgrammar_tracing_and_triton_only_when_asked() -> None:
    root = Path(__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-c", SERVE_THEN_CONSTRAIN], capture_output=True, text=True, cwd=root
    )
    assert result.returncode == 0, result.stderr
    served, num_plain_tokens, constrained_text, after_constraint = json.loads(
        result.stdout.splitlines()[-1]
    )

    assert num_plain_tokens == 4
    assert "torch" in served and set(served).isdisjoint(LAZY)
    assert re.fullmatch("[0-9]{3}", constrained_text)
    assert "xgrammar" in after_constraint and "triton" not in after_constraint
    assert "sympy" not in after_constraint


def test_every_import_of_baton_says_baton() -> None:
    # A checkout puts the card's folders on sys.path under their bare names (pytest's rootdir,
    # `python -c` in the repository), so `from core.engine import ...` would work here and fail
    # in an installed wheel. Every Python file of the repository is read.
    bare = []
    for path in sorted(REPO.rglob("*.py")):
        relative = path.relative_to(REPO)
        if relative.parts[0].startswith(".") or "build" in relative.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bare += [f"{relative}:{node.lineno} {n}" for n in names if n.split(".")[0] in LAYERS]

    assert not bare, "\n".join(bare)


def test_the_import_package_lists_every_folder_with_modules() -> None:
    # setuptools installs only the packages pyproject.toml lists: a new sub-package left out of
    # the list would work in the checkout and be missing from the wheel.
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        "baton." + ".".join(init.parent.relative_to(REPO).parts)
        for layer_name in LAYERS
        for init in (REPO / layer_name).rglob("__init__.py")
    }

    assert folders - listed == set()
    assert listed - folders == {"baton.static"}


def test_the_offline_api_loads_only_what_a_gpu_host_has() -> None:
    # A GPU host runs the offline benchmarks with torch, triton, transformers, tokenizers and
    # safetensors alone (DESIGN.md): `baton.app.llm` must not pull in the server's packages.
    loaded = loaded_after_importing("baton.app.llm")

    assert "baton.app.llm" in loaded
    roots = {name.partition(".")[0] for name in loaded}
    assert roots.isdisjoint(
        {*WEB_STACK, "orjson", "pydantic", "huggingface_hub", "gguf", "xgrammar", "uvloop"}
    )
