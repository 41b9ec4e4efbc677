"""`baton kernels build`: build the C++ CPU kernels ahead of time, so no server start waits for
the compiler; `baton kernels status`: whether this install's build is there, without building."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from baton.app.flags import FlagGroup
from baton.core.setting import setting


@dataclass(frozen=True, slots=True)
class KernelSettings:
    """The build `baton kernels` builds or looks for."""

    march: str | None = setting(
        None,
        help="the instruction set to build for, as gcc's -march names it (x86-64-v3: AVX2 and "
        "FMA; x86-64-v4: AVX-512); servers use the build when BATON_CPU_MARCH names the same",
        default_text="$BATON_CPU_MARCH, else native: this CPU's own",
    )


KERNELS = FlagGroup(KernelSettings, "kernels")


def add_kernels_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("kernels", help="build Baton's C++ CPU kernels ahead of time")
    actions = parser.add_subparsers(dest="kernels_command", required=True)
    build = actions.add_parser("build", help="build the kernels (or find the build) and say where")
    status = actions.add_parser("status", help="say whether the build is there, without building")
    for action, handler in ((build, build_kernels), (status, kernels_status)):
        KERNELS.add_to(action)
        action.set_defaults(handler=handler)


def build_kernels(args: argparse.Namespace) -> int:
    use_march(args)
    from baton.kernels import cpu_extension  # torch loads here, not with the CLI

    # The extension module's own lines (building..., waiting for another build) as they happen.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    build = cpu_extension.cpu_kernels()
    print_build(build.directory, build.key)
    if not build.available:
        return 1  # the reason is the log's last line
    state = f"built now, in {build.seconds:.1f} s" if build.state == "built" else "found"
    print(f"state:  {state}")
    return 0


def kernels_status(args: argparse.Namespace) -> int:
    use_march(args)
    from baton.kernels import cpu_extension

    directory = cpu_extension.build_directory()
    print_build(directory, cpu_extension.build_key())
    found = cpu_extension.cached_build(directory) is not None
    print(f"state:  {'built' if found else 'not built (baton kernels build builds it)'}")
    return 0 if found else 1


def use_march(args: argparse.Namespace) -> None:
    """--march, given to this process as servers take it: from the environment."""
    settings = KERNELS.build(args)
    if settings.march:
        os.environ["BATON_CPU_MARCH"] = settings.march


def print_build(directory: Path, key: str) -> None:
    from baton.kernels.cpu_extension import march

    print(f"folder: {directory}")
    print(f"key:    {key}")
    print(f"march:  {march()}")
