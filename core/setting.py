"""Declaring a setting once: a dataclass field whose metadata carries its command-line flag
(help text, name, choices), from which baton.app.flags builds the argparse argument. Plain
data, so core's configs declare their flags without importing the CLI."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The key a field's metadata holds its `Flag` under.
FLAG = "flag"


@dataclass(frozen=True, slots=True)
class Flag:
    """How a setting appears on the command line; `name` None is `--` and the field's name
    with dashes."""

    help: str
    name: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # Words for the default where its value would not tell a reader what happens (None, a path).
    default_text: str | None = None
    # Turns the flag's text into the field's value, for what the annotation's type cannot read
    # (a size such as 4GiB, a comma-separated list); ValueError's message is shown to the user.
    parse: Callable[[str], Any] | None = None
    # Given once per value (action append) rather than once.
    repeatable: bool = False
    # Values the flag takes at once, as argparse's nargs ("+": one or more).
    nargs: str | None = None
    required: bool = False
    # Flags that share this name are mutually exclusive.
    exclusive: str | None = None


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    **flag: Any,
) -> Any:
    """A dataclass field that is also a flag: `help` and the other `Flag` fields as keywords."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={FLAG: Flag(help, **flag)}
    )


def flag_of(field: dataclasses.Field) -> Flag | None:
    """The field's flag; None for a field that no command line sets."""
    return field.metadata.get(FLAG)


def comma_list(text: str) -> list[str]:
    """A comma-separated flag's items, blanks dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]
