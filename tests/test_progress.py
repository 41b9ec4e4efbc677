"""Progress bars (baton.app.commands.progress): drawn for a person at a terminal, never into a pipe
or with
`--json`; `baton simulate` shows one over its policies."""

from __future__ import annotations

import io
import json

from baton.app.cli import main
from baton.app.commands.progress import each

SIMULATE_QUICK = ["simulate", "--policy", "fcfs,sjf", "--rate", "4", "--num-requests", "20"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_each_yields_every_item_and_draws_only_on_a_terminal(monkeypatch):
    piped = io.StringIO()
    monkeypatch.setattr("sys.stderr", piped)
    assert list(each(["a", "b"], "working", "item")) == ["a", "b"]
    assert piped.getvalue() == ""
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert list(each(["a", "b"], "working", "item")) == ["a", "b"]
    assert "working" in terminal.getvalue() and "/2 [" in terminal.getvalue()
    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    assert list(each(["a"], "working", "item", quiet=True)) == ["a"]
    assert quiet.getvalue() == ""


def test_simulate_shows_progress_on_a_terminal_and_none_with_json(monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(SIMULATE_QUICK) == 0
    assert "simulating" in terminal.getvalue() and "sjf" in terminal.getvalue()
    # The bar names each run in words, not as the tuple the run is kept in.
    assert "(" not in terminal.getvalue() and "None" not in terminal.getvalue()
    capsys.readouterr()
    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    assert main([*SIMULATE_QUICK, "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["fcfs", "sjf"]
    assert "simulating" not in quiet.getvalue()
