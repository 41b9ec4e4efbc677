"""`baton simulate`: run scheduling policies on the same simulated arrivals, drawn from a
workload or replayed from a trace, and compare their goodput, SLO attainment and latency
(core/simulation/simulator.py does the simulating); with `--replicas N`, N engines behind each
router (core/simulation/replica_simulator.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import urllib.error
import urllib.request

from baton.app.commands.progress import each
from baton.core.config import POLICIES, EngineConfig
from baton.core.metrics.latency import percentile
from baton.core.replicas.router import ROUTERS
from baton.core.request import EngineRequest
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.scheduling.step_cost_profile import profile_executor
from baton.core.simulation.records import queue_trend, summarize
from baton.core.simulation.replica_simulator import simulate_replicas
from baton.core.simulation.simulator import (
    DEFAULT_COST,
    SimulationConfig,
    SimulationResult,
    simulate,
)
from baton.core.simulation.trace import load_trace
from baton.core.simulation.workloads import (
    PREFIX_WORKLOADS,
    WORKLOADS,
    LengthStats,
    WorkloadRequest,
    cap_max_tokens,
    sample_requests,
)

# Requests drawn from a synthetic workload when --num-requests is not given.
DEFAULT_NUM_REQUESTS = 2000

# Timed passes over the profile's step shapes when calibrating to a model (a server takes one).
CALIBRATION_ROUNDS = 3


def add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate",
        help="compare scheduling policies in a discrete-event simulation (no model runs)",
        description="Simulate the real scheduler and KV block pool on a step-cost model.",
    )
    defaults = EngineConfig()
    parser.add_argument(
        "--policy",
        default=None,
        help="comma-separated policies (default slo,fcfs,static; slo with --replicas > 1)",
    )
    parser.add_argument("--workload", choices=[*WORKLOADS, *PREFIX_WORKLOADS], default="mixed")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engine replicas behind the router; the rate from --load is of their combined "
        "saturation (each replica's times N)",
    )
    parser.add_argument(
        "--router",
        default=None,
        help=f"with --replicas > 1: comma-separated routers among {', '.join(ROUTERS)} "
        f"(default all)",
    )
    parser.add_argument(
        "--workload-file",
        metavar="PATH",
        default=None,
        help="replay a trace instead of drawing a workload: JSONL rows (arrival_s, "
        "prompt_tokens, output_tokens, optional ttft_ms, tpot_ms, priority, class) or the Azure "
        "LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="--workload-file: multiply every arrival time (0.5 replays at twice the rate)",
    )
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=float, default=None, help="requests per second")
    rate.add_argument(
        "--load",
        type=float,
        default=None,
        help="request rate as a fraction of the measured saturation rate (default 0.9)",
    )
    parser.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1: Poisson)"
    )
    parser.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help=f"requests to draw (default {DEFAULT_NUM_REQUESTS}); with --workload-file, the "
        "trace's first rows to replay (default all)",
    )
    parser.add_argument(
        "--length-scale", type=float, default=1.0, help="multiply every prompt and output length"
    )
    parser.add_argument(
        "--max-tokens",
        default="class",
        help="each request's max_tokens: class (its class's cap), exact (its own output "
        "length, the tightest) or a number for every request (longer answers are cut); static "
        "batching reserves KV for it",
    )
    parser.add_argument(
        "--slo-scale", type=float, default=1.0, help="multiply every class's SLO targets"
    )
    parser.add_argument("--seed", type=int, default=0)
    cost = parser.add_mutually_exclusive_group()
    cost.add_argument(
        "--cost",
        default=None,
        help="true step-cost coefficients in seconds, e.g. base=0.01,prefill=6e-5,decode=2e-4,"
        "context=1e-7 (default: an 8B model on an H100-class GPU)",
    )
    cost.add_argument(
        "--calibrate", metavar="MODEL_DIR", default=None, help="fit the coefficients to a model"
    )
    cost.add_argument(
        "--calibrate-from",
        metavar="URL",
        default=None,
        help="take the coefficients a running Baton server has fitted to its own steps "
        "(its GET /v1/stats), e.g. http://127.0.0.1:8000",
    )
    parser.add_argument("--api-key", default=None, help="API key for --calibrate-from")
    parser.add_argument(
        "--calibrate-requests",
        type=int,
        default=32,
        help="workload requests served offline on the model while calibrating",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--noise", type=float, default=0.05, help="± share of step-time noise")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens
    )
    parser.add_argument("--num-kv-blocks", type=int, default=8192)
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--max-wait-ms", type=float, default=defaults.max_wait_ms)
    parser.add_argument("--max-preemptions", type=int, default=defaults.max_preemptions)
    parser.add_argument(
        "--slo-admission-factor",
        type=float,
        default=defaults.slo_admission_factor,
        help="with the slo policy, refuse a request once it is predicted to start, or has "
        "waited, later than this factor times its TTFT target, as baton serve does (0: off)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    default_policies = "slo,fcfs,static" if args.replicas == 1 else "slo"
    policies = _names(args.policy or default_policies)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"--policy takes a comma-separated list of {', '.join(POLICIES)}")
    if args.router is not None and args.replicas == 1:
        raise ValueError("--router applies to --replicas > 1: one engine needs no routing")
    routers = _names(args.router or ",".join(ROUTERS))
    if not routers or any(r not in ROUTERS for r in routers):
        raise ValueError(f"--router takes a comma-separated list of {', '.join(ROUTERS)}")
    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    if args.workload_file and (args.rate is not None or args.load is not None):
        raise ValueError(
            "--rate and --load do not apply to --workload-file: the trace sets the arrival "
            "times (--time-scale speeds them up or slows them down)"
        )
    if args.time_scale != 1.0 and not args.workload_file:
        raise ValueError("--time-scale applies to --workload-file only; use --rate or --load")
    config = SimulationConfig(
        engine=EngineConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            # Only shared-prefix workloads share a block between prompts.
            enable_prefix_caching=args.workload in PREFIX_WORKLOADS and not args.workload_file,
            max_wait_ms=args.max_wait_ms,
            max_preemptions=args.max_preemptions,
            slo_admission_factor=args.slo_admission_factor,
        ),
        num_kv_blocks=args.num_kv_blocks,
        cost=_coefficients(args),
        noise=args.noise,
        seed=args.seed,
        slo_scale=args.slo_scale,
    )
    if args.workload_file:
        workload = load_trace(
            args.workload_file,
            time_scale=args.time_scale,
            length_scale=args.length_scale,
            limit=args.num_requests,
        )
        rate = mean_rate(workload)
        # A trace's own rows queued at once say little of saturation: too few to fill the
        # machine for long, they measure mostly the longest answer's drain.
        saturation = None
    else:
        num_requests = args.num_requests or DEFAULT_NUM_REQUESTS
        saturation = None
        rate = args.rate
        if rate is None:
            saturation = args.replicas * saturation_rps(
                args.workload,
                num_requests,
                args.seed,
                config,
                args.length_scale,
                args.max_tokens,
            )
            rate = (0.9 if args.load is None else args.load) * saturation
        workload = sample_requests(
            args.workload, num_requests, rate, args.seed, args.burstiness, args.length_scale
        )
    runs = [(policy, None) for policy in policies]
    if args.replicas > 1:
        runs = [(policy, router) for policy in policies for router in routers]
    workload = cap_max_tokens(workload, args.max_tokens)
    report = {}
    for policy, router in each(runs, "simulating", "run", quiet=args.json):
        started = time.perf_counter()
        result: SimulationResult
        name = policy
        if router is None:
            result = simulate(policy, workload, config)
        else:
            result = simulate_replicas(router, policy, workload, config, args.replicas)
            name = router if len(policies) == 1 else f"{policy}/{router}"
        summary = summarize(result.records)
        classes = sorted({r.class_name for r in result.records})
        trend = queue_trend(result.records)
        warning = trend.warning()
        if warning:
            print(f"baton simulate: warning: {name}: {warning}", file=sys.stderr)
        report[name] = {
            **summary,
            "rate_rps": rate,
            "saturation_rps": saturation,
            "num_preemptions": result.num_preemptions,
            "num_steps": result.num_steps,
            "step_cost_model_error_ratio": result.step_cost_error,
            "length_predictor_error_ratio": result.length_error,
            "queue": trend.as_dict(),
            "warning": warning,
            "classes": {
                name: summarize([r for r in result.records if r.class_name == name])
                for name in classes
            },
            "wall_s": time.perf_counter() - started,
        }
        if router is not None:
            report[name].update(
                policy=policy,
                router=router,
                replicas=args.replicas,
                requests_per_replica=result.requests_per_replica,
                prefix_cache_hit_rate=result.prefix_cache_hits
                / max(1, result.prefix_cache_queries),
                route_us_p50=percentile(sorted(result.route_wall_s), 50) * 1e6,
                route_us_p99=percentile(sorted(result.route_wall_s), 99) * 1e6,
            )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        lengths = LengthStats.of(workload)
        print_table(report, args, len(workload), rate, saturation, config.cost, lengths)
    return 0


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def mean_rate(workload: list[WorkloadRequest]) -> float:
    """Arrivals per second over a workload's arrival span (infinite when all arrive at once)."""
    span = workload[-1].arrival_s - workload[0].arrival_s
    return (len(workload) - 1) / span if span > 0 else math.inf


def saturation_rps(
    workload: str,
    num_requests: int,
    seed: int,
    config: SimulationConfig,
    length_scale: float = 1.0,
    max_tokens: str = "class",
) -> float:
    """The throughput FCFS reaches with every request queued at once: the most this machine
    can serve, whatever the order. Without the starvation bound: in a backlog every request
    would pass it, and the preemptions that keep it would measure the bound, not the machine."""
    backlog = sample_requests(workload, num_requests, math.inf, seed, 1.0, length_scale)
    backlog = cap_max_tokens(backlog, max_tokens)
    unbounded = dataclasses.replace(config.engine, max_wait_ms=math.inf)
    result = simulate("fcfs", backlog, dataclasses.replace(config, engine=unbounded))
    return summarize(result.records)["throughput_rps"]


def _coefficients(args: argparse.Namespace) -> CostCoefficients:
    if args.calibrate:
        from baton.app.llm import build_engine  # torch loads only when calibrating on a real model

        config = EngineConfig(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        )
        engine = build_engine(args.calibrate, config, args.device)
        model = engine.step_cost_model
        executor = engine.executor
        profile_executor(
            model,
            executor,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            engine.max_model_len,
            engine.vocab_size,
            rounds=CALIBRATION_ROUNDS,
        )
        _calibration_run(engine, args)
        fitted = model.current
        print(f"calibrated: {_format_cost(fitted)}", file=sys.stderr)
        return fitted
    if args.calibrate_from:
        fitted = served_coefficients(args.calibrate_from, args.api_key)
        print(f"calibrated: {_format_cost(fitted)}", file=sys.stderr)
        return fitted
    return CostCoefficients.parse(args.cost) if args.cost else DEFAULT_COST


def served_coefficients(base_url: str, api_key: str | None = None) -> CostCoefficients:
    """The step-cost model a running server has fitted online to its own steps: those steps
    share the machine with the event loop, streaming and clients, which an offline calibration
    (the engine alone) does not see."""
    url = base_url.rstrip("/") + "/v1/stats"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=30
        ) as reply:
            stats = json.load(reply)
    except urllib.error.HTTPError as error:
        raise ValueError(f"--calibrate-from: {url} answered HTTP {error.code}") from error
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--calibrate-from: cannot read {url}: {error}") from error
    cost = stats.get("step_cost") if isinstance(stats, dict) else None
    if not isinstance(cost, dict):
        raise ValueError(f"--calibrate-from: {url} reports no step_cost (not a Baton server?)")
    if not cost.get("observations"):
        raise ValueError(f"--calibrate-from: the server at {base_url} has not timed a step yet")
    return CostCoefficients(
        base_s=cost["base_ms"] / 1e3,
        per_prefill_token_s=cost["prefill_us_per_token"] / 1e6,
        per_decode_token_s=cost["decode_us_per_token"] / 1e6,
        per_context_token_s=cost["context_ns_per_token"] / 1e9,
    )


def _calibration_run(engine, args: argparse.Namespace) -> None:
    """Serve a slice of the workload offline so the model also fits to steps shaped like the
    real ones (the profile's synthetic shapes may be far from them)."""
    from baton.core.sampling_params import SamplingParams

    specs = sample_requests(
        args.workload, args.calibrate_requests, math.inf, args.seed, 1.0, args.length_scale
    )
    for index, spec in enumerate(specs):
        output_len = min(spec.output_len, engine.max_model_len // 2)
        prompt_len = max(1, min(spec.prompt_len, engine.max_model_len - output_len - 1))
        prompt = [(index * 31 + i) % engine.vocab_size for i in range(prompt_len)]
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        request = EngineRequest(f"calibrate-{index}", prompt, params)
        engine.add_request(engine.validator.validate(request))
    while engine.has_unfinished_requests:
        engine.step()


def _format_cost(cost: CostCoefficients) -> str:
    return (
        f"base={cost.base_s:.3g},prefill={cost.per_prefill_token_s:.3g},"
        f"decode={cost.per_decode_token_s:.3g},context={cost.per_context_token_s:.3g}"
    )


def print_table(
    report: dict,
    args: argparse.Namespace,
    num_requests: int,
    rate: float,
    saturation: float | None,
    cost,
    lengths: LengthStats,
) -> None:
    load = f" ({rate / saturation:.0%} of saturation {saturation:.2f}/s)" if saturation else ""
    if args.workload_file:
        source = f"trace {args.workload_file} (time scale {args.time_scale:g})"
    else:
        source = f"workload {args.workload}, burstiness {args.burstiness}"
    replicas = f" on {args.replicas} replicas" if args.replicas > 1 else ""
    print(
        f"{source}, {num_requests} requests at {rate:.2f}/s{load}{replicas}, seed {args.seed}; "
        f"cost {_format_cost(cost)}"
    )
    print(
        f"prompt length mean {lengths.prompt_mean:.0f} (CV {lengths.prompt_cv:.2f}), output "
        f"length mean {lengths.output_mean:.0f} (CV {lengths.output_cv:.2f}), max_tokens "
        f"{args.max_tokens}"
    )
    header = (
        f"{'policy':<18}{'served/s':>9}{'goodput/s':>10}{'SLO met':>9}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'TTFT max':>10}{'TPOT p99':>10}{'max wait':>10}{'preempt':>9}"
        f"{'max/req':>8}{'rejected':>10}"
    )
    print(header)
    print("-" * len(header))
    for policy, row in report.items():
        print(
            f"{policy:<18}{row['throughput_rps']:>9.2f}{row['goodput_rps']:>10.2f}"
            f"{row['slo_attainment']:>9.1%}{_ms(row['ttft_p50_ms'])}{_ms(row['ttft_p99_ms'])}"
            f"{_ms(row['ttft_max_ms'])}{_ms(row['tpot_p99_ms'])}{_ms(row['max_wait_ms'])}"
            f"{row['num_preemptions']:>9}{row['max_preemptions_per_request']:>8}"
            f"{row['rejected']:>10}"
        )
        if "requests_per_replica" in row:
            print(
                f"  requests per replica {row['requests_per_replica']}, prefix cache hits "
                f"{row['prefix_cache_hit_rate']:.1%}, routing p50 {row['route_us_p50']:.0f} us "
                f"p99 {row['route_us_p99']:.0f} us (wall)"
            )
        for name, cls in row["classes"].items():
            print(
                f"  {name:<16}{cls['throughput_rps']:>9.2f}{cls['goodput_rps']:>10.2f}"
                f"{cls['slo_attainment']:>9.1%}{_ms(cls['ttft_p50_ms'])}{_ms(cls['ttft_p99_ms'])}"
                f"{_ms(cls['ttft_max_ms'])}{_ms(cls['tpot_p99_ms'])}{_ms(cls['max_wait_ms'])}"
                f"{'':>9}{cls['max_preemptions_per_request']:>8}{cls['rejected']:>10}"
            )


def _ms(value: float | None) -> str:
    """A latency cell; a dash where no request was served to measure it."""
    return f"{'-':>10}" if value is None else f"{value:>8.0f}ms"
