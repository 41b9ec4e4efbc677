"""One interface to the engine: both engines the front end can be given (the in-process one and
the replicas) implement `EngineClient` member for member, with its signatures, and the front end
reaches nothing of an engine beyond it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from baton.app.engine.async_engine import AsyncEngine
from baton.app.engine.client import EngineClient
from tests.factory import make_engine

APP = Path(__file__).resolve().parent.parent / "app"
# The engines' own modules may reach past the protocol: they are its implementations.
ENGINE_MODULES = {"engine/async_engine.py", "replicas/replicated_engine.py"}


def protocol_members() -> dict[str, object]:
    return {
        name: member
        for name, member in vars(EngineClient).items()
        if not name.startswith("_") and (isinstance(member, property) or inspect.isfunction(member))
    }


def signature(member: object) -> inspect.Signature:
    """A method's signature, or a property's getter's, with annotations as written."""
    function = member.fget if isinstance(member, property) else member
    return inspect.signature(function)


def engine_classes() -> list[type]:
    # Ray is an optional extra of the package, but the test environment installs it.
    from baton.app.replicas.replicated_engine import ReplicatedEngine

    return [AsyncEngine, ReplicatedEngine]


def test_the_protocol_covers_submit_abort_stats_and_health():
    assert {"submit", "abort", "stats", "healthy", "validator"} <= set(protocol_members())


@pytest.mark.parametrize("engine_class", engine_classes(), ids=lambda cls: cls.__name__)
def test_each_engine_implements_every_member_with_its_signature(engine_class):
    for name, member in protocol_members().items():
        implementation = inspect.getattr_static(engine_class, name, None)
        assert implementation is not None, f"{engine_class.__name__} lacks {name}"
        assert isinstance(implementation, property) == isinstance(member, property), name
        assert signature(implementation) == signature(member), name


def test_an_async_engine_is_an_engine_client():
    assert isinstance(AsyncEngine(make_engine(), max_queued_requests=4), EngineClient)


def test_the_front_end_reaches_engines_only_through_the_protocol():
    members = set(protocol_members())
    reached = {}
    for path in APP.rglob("*.py"):
        if path.relative_to(APP).as_posix() in ENGINE_MODULES:
            continue
        for name in re.findall(r"\bstate\.engine\.(\w+)", path.read_text()):
            reached.setdefault(name, path.name)
    outside = {name: where for name, where in reached.items() if name not in members}
    assert reached and not outside
