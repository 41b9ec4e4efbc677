"""What one SLO admission decision costs the event loop: `TTFTForecast.predict` under a heavy
ledger (requests in flight, a full batch, a busy arrival window).

    python benchmarks/admission_forecast_cost.py [--in-flight 512] [--rate 100]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from baton.core.request import SLO
from baton.core.scheduling.step_cost import StepCostModel
from baton.core.scheduling.ttft_forecast import TTFTForecast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=512, help="half decoding, half owed")
    parser.add_argument("--rate", type=float, default=100.0, help="arrivals/s over the window")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()

    rng = random.Random(0)
    decoding = args.in_flight // 2
    forecast = TTFTForecast(StepCostModel(), 2048, max_num_seqs=decoding, max_wait_s=20.0)
    forecast.lifetime_s = 5.0
    num_arrivals = max(args.in_flight, round(args.rate * args.window_s))
    now = 0.0
    for i in range(num_arrivals):
        now = i / args.rate
        slo = SLO(ttft_ms=rng.choice([500, 5000]), tpot_ms=None)
        forecast.add(f"r{i}", rng.randint(32, 2000), slo, now)
    ids = list(forecast._in_flight)
    for request_id in ids[: num_arrivals - args.in_flight]:
        forecast.remove(request_id, now)
    for request_id in ids[num_arrivals - args.in_flight :][:decoding]:
        forecast.first_token(request_id, now)

    def per_call_ms(num_prompt_tokens: int, ttft_ms: float) -> float:
        start = time.perf_counter()
        for _ in range(args.iters):
            forecast.predict(num_prompt_tokens, ttft_ms, now + 0.001)
        return round((time.perf_counter() - start) / args.iters * 1e3, 3)

    report = {
        "in_flight": args.in_flight,
        "owed": forecast.num_owed,
        "window_arrivals": num_arrivals,
        "predict_ms_interactive": per_call_ms(100, 500),
        "predict_ms_rag": per_call_ms(1500, 5000),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
