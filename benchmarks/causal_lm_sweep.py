"""Baton's verdict on every causal LM type of the installed transformers, as markdown: the
counts by verdict, then the types grouped by verdict (the README's table), and the CPU and
wall time the sweep took. Verdicts are baton.tools.causal_lm_sweep's.

    python benchmarks/causal_lm_sweep.py            # every type
    python benchmarks/causal_lm_sweep.py gpt2 opt   # some
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

from baton.tools.causal_lm_sweep import Verdict, causal_lm_types, run_sweep


def markdown(verdicts: dict[str, Verdict]) -> str:
    """The counts table and one line per verdict listing its types."""
    groups: dict[str, list[str]] = defaultdict(list)
    for model_type, verdict in sorted(verdicts.items()):
        groups[verdict.label].append(model_type)
    order = sorted(groups, key=lambda label: (label != "exact", label.startswith("unbuilt"), label))
    lines = ["| verdict | types |", "|---|---|"]
    lines += [f"| {label} | {len(groups[label])} |" for label in order]
    lines += ["", "| verdict | types |", "|---|---|"]
    lines += [f"| {label} | {', '.join(groups[label])} |" for label in order]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="model types (default: all)")
    args = parser.parse_args()
    wall, cpu = time.perf_counter(), time.process_time()
    verdicts = run_sweep(args.types or causal_lm_types())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(markdown(verdicts))
    print(
        f"\n{len(verdicts)} types in {wall:.0f} s wall, {cpu:.0f} s CPU; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
