"""`baton simulate`'s own settings: which policies and routers run, on what arrivals, at what
rate, and on which machine's step costs; its flags are the fields."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.config import POLICIES
from baton.core.replicas.router import ROUTERS
from baton.core.setting import setting

# Requests drawn from a synthetic workload when --num-requests is not given.
DEFAULT_NUM_REQUESTS = 2000
# The request rate's share of the saturation rate when neither --rate nor --load is given.
DEFAULT_LOAD = 0.9


@dataclass(frozen=True, slots=True)
class SimulateSettings:
    policy: str | None = setting(
        None,
        help=f"comma-separated policies among {', '.join(POLICIES)}",
        default_text="slo,fcfs,static; slo with --replicas > 1",
    )
    router: str | None = setting(
        None,
        help=f"with --replicas > 1: comma-separated routers among {', '.join(ROUTERS)}",
        default_text="all",
    )
    workload_file: str | None = setting(
        None,
        metavar="PATH",
        help="replay a trace instead of drawing a workload: JSONL rows (arrival_s, "
        "prompt_tokens, output_tokens, optional ttft_ms, tpot_ms, priority, class) or the Azure "
        "LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
        default_text="none: draw --workload",
    )
    rate: float | None = setting(
        None, exclusive="rate", help="requests per second", default_text="from --load"
    )
    load: float | None = setting(
        None,
        exclusive="rate",
        help="request rate as a fraction of the measured saturation rate",
        default_text=str(DEFAULT_LOAD),
    )
    num_requests: int | None = setting(
        None,
        help="requests to draw; with --workload-file, the trace's first rows to replay",
        default_text=f"{DEFAULT_NUM_REQUESTS}; with --workload-file, all",
    )
    max_tokens: str = setting(
        "class",
        help="each request's max_tokens: class (its class's cap), exact (its own output "
        "length, the tightest) or a number for every request (longer answers are cut); static "
        "batching reserves KV for it",
    )
    cost: str | None = setting(
        None,
        exclusive="cost",
        help="true step-cost coefficients in seconds, e.g. base=0.01,prefill=6e-5,decode=2e-4,"
        "context=1e-7",
        default_text="an 8B model on an H100-class GPU",
    )
    calibrate: str | None = setting(
        None,
        exclusive="cost",
        metavar="MODEL_DIR",
        help="fit the coefficients to a model",
        default_text="none",
    )
    calibrate_from: str | None = setting(
        None,
        exclusive="cost",
        metavar="URL",
        help="take the coefficients a running Baton server has fitted to its own steps "
        "(its GET /v1/stats), e.g. http://127.0.0.1:8000",
        default_text="none",
    )
    calibrate_requests: int = setting(
        32, help="workload requests served offline on the model while calibrating"
    )
    noise: float = setting(
        0.05, help="each simulated step's duration varies by up to ± this share (random noise)"
    )
    draft_acceptance: float = setting(
        0.7,
        help="with --speculative-method, the chance the simulated model accepts each draft "
        "token (the workload's acceptance rate); each policy then runs with and without "
        "speculation",
    )
