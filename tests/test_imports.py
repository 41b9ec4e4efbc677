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

PACKAGES = ("app", "core", "gpu", "kernels")
WEB_STACK = ("starlette", "uvicorn", "websockets")
# What a package must never import, not even lazily.
FORBIDDEN = {
    "core": ("torch", "triton", *WEB_STACK, "app", "gpu", "kernels"),
    "gpu": (*WEB_STACK, "app"),
    "kernels": (*WEB_STACK, "app", "gpu"),
}
# Offline tools a server never needs.
OFFLINE_TOOLS = ("gpu.train_demo", "gpu.random_checkpoint", "gpu.tokenizer_trainer")


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
    # `from kernels import ops` names the module kernels.ops, not the package.
    assert resolve("kernels.ops") == "kernels.ops"
    assert resolve("kernels.ops.paged_attention") == "kernels.ops"
    assert resolve("torch.nn") is None
    assert "kernels.ops" in import_graph()["gpu.model"]


def test_no_import_circle_among_app_core_gpu_and_kernels() -> None:
    graph = import_graph()

    found = tangles(graph)

    assert not found, "import circles:\n" + "\n".join(describe(graph, t) for t in found)


def test_each_package_imports_only_what_lies_below_it() -> None:
    wrong = []
    for module in package_modules():
        forbidden = FORBIDDEN.get(module.partition(".")[0], ())
        for name in sorted(imported_names(module)):
            if name.partition(".")[0] in forbidden:
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
    core_modules = [m for m in package_modules() if m.partition(".")[0] == "core"]

    loaded = loaded_after_importing(*core_modules)

    assert "core.engine" in loaded
    roots = {name.partition(".")[0] for name in loaded}
    assert roots.isdisjoint({"torch", "triton", *WEB_STACK})


def test_a_server_import_loads_no_offline_tool() -> None:
    loaded = loaded_after_importing("app.server", "app.cli", "gpu.executor")

    assert "gpu.executor" in loaded
    assert loaded.isdisjoint(OFFLINE_TOOLS)


# Loaded by a CPU server only once a request needs them: structured output (xgrammar, and the
# transformers tokenizer it reads the vocabulary with), tracing (opentelemetry), CUDA (triton);
# never: torch's compiler and what it pulls in (sympy), torch's extension builder (setuptools).
LAZY = ("xgrammar", "transformers", "opentelemetry", "triton", "sympy", "setuptools")
SERVE_THEN_CONSTRAIN = """
import json, sys
from app.async_engine import AsyncEngine
from app.cli import DEMO_MODEL
from app.llm import LLM
from app.server import create_app
from app.settings import ServerSettings
from app.state import ServerState
from core.sampling_params import SamplingParams
from core.structured_output import GuideKind, StructuredOutput

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
