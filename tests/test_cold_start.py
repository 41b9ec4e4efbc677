"""benchmarks/cold_start.py's torch floor: what `import torch` alone costs, and Baton's figures
less it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cold_start  # noqa: E402


def test_the_floor_is_a_python_that_imported_torch():
    floor = cold_start.torch_floor(ROOT)
    assert set(floor) == {"ready_s", "rss_mib", "peak_rss_mib"}
    assert floor["ready_s"] > 0
    # torch's libraries and modules alone are well over 100 MiB resident; a bare Python ~10.
    assert floor["rss_mib"] > 100
    assert floor["peak_rss_mib"] >= floor["rss_mib"]


def test_each_run_is_less_the_floor_of_its_own_round():
    runs = [{"ready_s": 2.5, "rss_mib": 400.0}, {"ready_s": 3.0, "rss_mib": 410.0}]
    floors = [{"ready_s": 2.0, "rss_mib": 220.0}, {"ready_s": 2.25, "rss_mib": 230.0}]
    assert cold_start.above(runs, floors) == [
        {"ready_s": 0.5, "rss_mib": 180.0},
        {"ready_s": 0.75, "rss_mib": 180.0},
    ]
    with pytest.raises(ValueError):
        cold_start.above(runs, floors[:1])
