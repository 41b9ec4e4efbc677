"""Command-line flags made from settings dataclasses: each field declared with
`baton.core.setting.setting` becomes one argparse argument, its help ending in its default, and
the parsed namespace becomes the dataclass again."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from baton.core.setting import Flag, flag_of

Settings = TypeVar("Settings")


@dataclasses.dataclass(frozen=True)
class FlagGroup(Generic[Settings]):
    """The flags a command takes from one settings dataclass: all its flag fields, or `only`
    those; `defaults` replaces a field's default in this command (simulate's KV cache is a
    fixed size, a server's is sized from memory) and `choices` narrows a field's choices."""

    settings: type[Settings]
    title: str
    only: tuple[str, ...] | None = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    choices: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def fields(self) -> list[tuple[dataclasses.Field, Flag]]:
        """The group's fields with their flags, in declaration order."""
        chosen = []
        for field in dataclasses.fields(self.settings):
            flag = flag_of(field)
            if flag is not None and (self.only is None or field.name in self.only):
                chosen.append((field, flag))
        unknown = set(self.only or ()) | set(self.defaults) | set(self.choices)
        unknown -= {field.name for field, _ in chosen}
        if unknown:
            raise TypeError(f"{self.settings.__name__} has no flag field {', '.join(unknown)}")
        return chosen

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the group's flags to `parser`, under a heading of their own in --help."""
        group = parser.add_argument_group(self.title)
        exclusive: dict[str, Any] = {}
        hints = typing.get_type_hints(self.settings)
        for field, flag in self.fields():
            target = group
            if flag.exclusive is not None:
                if flag.exclusive not in exclusive:
                    exclusive[flag.exclusive] = group.add_mutually_exclusive_group()
                target = exclusive[flag.exclusive]
            _add_argument(target, self, field, flag, hints[field.name])

    def build(self, args: argparse.Namespace, **given: Any) -> Settings:
        """The settings the parsed flags give; `given` sets the fields that are not flags here,
        and every other field keeps its default."""
        values = {field.name: getattr(args, _dest(field, flag)) for field, flag in self.fields()}
        return self.settings(**values, **given)

    def default(self, field: dataclasses.Field) -> Any:
        """The field's default in this command."""
        return self.defaults[field.name] if field.name in self.defaults else _declared(field)


def _add_argument(
    target: Any, group: FlagGroup, field: dataclasses.Field, flag: Flag, hint: Any
) -> None:
    name = _option(field, flag)
    default = group.default(field)
    kind = _value_type(hint)
    options: dict[str, Any] = {"dest": _dest(field, flag), "default": default}
    if kind is bool:
        # A switch that is on by default needs --no-x to turn it off; one that is off needs only
        # --x, and a --no-x beside it would say nothing.
        options["action"] = argparse.BooleanOptionalAction if default else "store_true"
    else:
        if flag.repeatable:
            options["action"] = "append"
        element = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
        options["type"] = element if flag.parse is None else _user_error(flag.parse)
        choices = group.choices.get(field.name, flag.choices)
        if choices is not None:
            options["choices"] = choices
        if flag.metavar is not None:
            options["metavar"] = flag.metavar
        if flag.nargs is not None:
            options["nargs"] = flag.nargs
        options["required"] = flag.required
    action = target.add_argument(name, **options)
    # Set after the action is made: some Python versions' BooleanOptionalAction appends a
    # default of its own to the help it is given.
    action.help = _help(flag, field, default).replace("%", "%%")
    # The setting behind the flag, for tests that check each flag has exactly one.
    action.setting = f"{group.settings.__qualname__}.{field.name}"


def _option(field: dataclasses.Field, flag: Flag) -> str:
    return flag.name or "--" + field.name.replace("_", "-")


def _dest(field: dataclasses.Field, flag: Flag) -> str:
    """The namespace attribute a flag sets, named after the flag rather than the field: two
    groups on one command may have fields of one name (the engine's seed and the sampling seed,
    --seed and --sampling-seed), never two flags of one name."""
    return _option(field, flag).removeprefix("--").replace("-", "_")


def _value_type(hint: Any) -> Any:
    """`int | None` -> int: the type of the value a flag gives."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        present = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(present) == 1:
            return present[0]
    return hint


def _user_error(convert: Any) -> Any:
    """`convert` with its ValueError's message as argparse's error; argparse's own ("invalid
    value") would drop the message that says what to change."""

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error) or f"invalid value {text!r}") from None

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _declared(field: dataclasses.Field) -> Any:
    """The default the dataclass declares for `field`."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _help(flag: Flag, field: dataclasses.Field, default: Any) -> str:
    """The flag's help, ending in its default: in words where the field gives them for its own
    default, else the value."""
    if flag.required:
        return f"{flag.help} (required)"
    if flag.default_text is not None and default == _declared(field):
        shown = flag.default_text
    elif default is None:
        raise TypeError(
            f"{field.name}: a setting whose default is None says what None means (default_text)"
        )
    else:
        shown = describe(default)
    return f"{flag.help} (default: {shown})"


def describe(value: Any) -> str:
    """A default as --help shows it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)
