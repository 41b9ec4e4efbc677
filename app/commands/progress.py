"""Progress bars for the commands that run for minutes (`baton bench`, `baton simulate`): drawn
on stderr only when a person is watching it (a terminal) and the output is not for a program
(`--json`), so pipes, logs and CI output stay clean."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def shown(quiet: bool = False) -> bool:
    return not quiet and sys.stderr.isatty()


def progress_bar(total: int, description: str, unit: str, *, quiet: bool = False) -> tqdm:
    """A bar to `update()` by hand; one that draws nothing when not `shown`. It clears itself
    when closed, so the results printed after it stand alone."""
    return tqdm(
        total=total,
        desc=description,
        unit=unit,
        file=sys.stderr,
        disable=not shown(quiet),
        leave=False,
        dynamic_ncols=True,
    )


def each(items: Iterable[T], description: str, unit: str, *, quiet: bool = False) -> Iterator[T]:
    """`items`, one at a time, with a bar that names the item in progress."""
    items = list(items)
    with progress_bar(len(items), description, unit, quiet=quiet) as bar:
        for item in items:
            bar.set_postfix_str(str(item))
            yield item
            bar.update()
