"""What one `GET /metrics` scrape costs to render under each `--metrics-style`, without a
server: the collector reading the stats snapshot and the aggregates and prometheus-client
writing the text format. The styles are timed in turns (A/B/C, repeated) so machine noise
lands on all of them alike.

    python benchmarks/metrics_scrape_cost.py --scrapes 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from baton.app.engine.async_engine import AsyncEngine
from baton.app.observability.prometheus import ServerMetrics
from baton.app.settings import METRICS_STYLES
from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.metrics.metric_aggregates import EngineMetrics
from baton.core.simulation.simulated_executor import SimulatedExecutor


def filled(aggregates: EngineMetrics, seed: int = 0) -> None:
    """Put a busy server's worth of observations in every histogram."""
    rng = random.Random(seed)
    for name, value in vars(aggregates).items():
        if hasattr(value, "observe_many"):
            value.observe_many([rng.expovariate(20.0) for _ in range(5000)])
        elif name == "totals":
            value.requests = value.prompt_tokens = value.generation_tokens = 5000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    executor = SimulatedExecutor(256, 16, 1000)
    engine = Engine(EngineConfig(), executor, max_model_len=4096, vocab_size=1000, eos_token_ids=[])
    per_style = {}
    for style in METRICS_STYLES:
        metrics = ServerMetrics(AsyncEngine(engine, 16), model_name="m", style=style)
        filled(metrics.aggregates)
        per_style[style] = (metrics, [])
    for _ in range(args.rounds):
        for metrics, times in per_style.values():
            started = time.perf_counter()
            for _ in range(args.scrapes):
                metrics.exposition()
            times.append((time.perf_counter() - started) / args.scrapes)
    report = {
        style: {
            "median_us_per_scrape": statistics.median(times) * 1e6,
            "bytes": len(metrics.exposition()),
        }
        for style, (metrics, times) in per_style.items()
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
