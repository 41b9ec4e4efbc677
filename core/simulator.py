"""The discrete-event simulator behind `baton simulate`: the real scheduler, KV block pool and
policies, driven by a workload's arrivals, with each step charged the duration the step-cost
model gives it. No model runs, so thousands of requests simulate in seconds.

The policies see what they would see in a server: their own step-cost model, seeded by the
same warm-up profile and refitted to every simulated step, and an output-length predictor
learning from finished requests; the "machine" is the true cost coefficients. With the `slo`
policy, arrivals pass the server's SLO admission control first, on the simulated clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from core.batch import ExecutorOutput
from core.config import EngineConfig
from core.kv_cache_manager import KVCacheManager
from core.length_predictor import LengthPredictor
from core.policy import PolicyContext, make_policy
from core.request import SLO, FinishReason, Request
from core.sampling_params import SamplingParams
from core.scheduler import Scheduler
from core.step_cost import (
    CostCoefficients,
    StepCostModel,
    StepShape,
    profile_shapes,
    warm_up,
)
from core.ttft_forecast import TTFTForecast
from core.workloads import WorkloadRequest

# Roughly an 8B model on one H100-class GPU: 10 ms per step, 16k prefill tokens/s, 0.2 ms per
# decoding sequence and 0.1 µs per KV entry read.
DEFAULT_COST = CostCoefficients(
    base_s=0.010, per_prefill_token_s=6e-5, per_decode_token_s=2e-4, per_context_token_s=1e-7
)


@dataclass(slots=True)
class SimulationConfig:
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(enable_prefix_caching=False))
    num_kv_blocks: int = 8192
    cost: CostCoefficients = field(default_factory=lambda: DEFAULT_COST)
    # Multiplicative noise on each step's true duration (uniform ± this share), so the fitted
    # model is never exact, as on a real machine.
    noise: float = 0.0
    seed: int = 0
    # Multiplies every class's SLO targets (a slow machine needs looser ones).
    slo_scale: float = 1.0
    # With the `slo` policy, refuse an arrival predicted to miss its TTFT target by this factor
    # because of the queue, as `baton serve --slo-admission-factor` (same default); 0: off.
    slo_admission_factor: float = 3.0


@dataclass(slots=True)
class RequestRecord:
    """What the simulation measured for one request (seconds on the simulated clock)."""

    class_name: str
    arrival_s: float
    num_output_tokens: int
    ttft_ms_target: float | None
    tpot_ms_target: float | None
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    # Refused by SLO admission control at arrival (its times are then its arrival time).
    rejected: bool = False

    @property
    def ttft_ms(self) -> float:
        return (self.first_token_s - self.arrival_s) * 1000

    @property
    def tpot_ms(self) -> float:
        if self.num_output_tokens < 2:
            return 0.0
        return (self.finish_s - self.first_token_s) * 1000 / (self.num_output_tokens - 1)

    @property
    def wait_ms(self) -> float:
        return (self.first_scheduled_s - self.arrival_s) * 1000

    @property
    def slo_met(self) -> bool:
        if self.rejected:
            return False
        ttft_ok = self.ttft_ms_target is None or self.ttft_ms <= self.ttft_ms_target
        tpot_ok = self.tpot_ms_target is None or self.tpot_ms <= self.tpot_ms_target
        return ttft_ok and tpot_ok


@dataclass(slots=True)
class SimulationResult:
    policy: str
    records: list[RequestRecord]
    num_steps: int
    num_preemptions: int
    step_cost_error: float | None
    length_error: float | None


def simulate(
    policy: str, workload: list[WorkloadRequest], config: SimulationConfig
) -> SimulationResult:
    """Serve `workload` under `policy` on the simulated machine; every request runs to its
    output length (or `max_tokens`)."""
    engine_config = config.engine
    cost_model = StepCostModel()
    full = engine_config.max_num_batched_tokens
    warm_up(cost_model, config.cost.predict, profile_shapes(full, engine_config.max_num_seqs, 8192))
    predictor = LengthPredictor()
    context = PolicyContext(
        cost_model, predictor, engine_config.max_wait_ms / 1000, full, engine_config.max_num_seqs
    )
    kv_cache = KVCacheManager(
        config.num_kv_blocks, engine_config.block_size, engine_config.enable_prefix_caching
    )
    scheduler = Scheduler(
        kv_cache,
        make_policy(policy, context),
        engine_config.max_num_seqs,
        engine_config.max_num_batched_tokens,
    )
    admission = None
    if policy == "slo" and config.slo_admission_factor > 0:
        admission = SLOAdmission(context, config.slo_admission_factor)
    noise = random.Random(config.seed)
    specs = sorted(enumerate(workload), key=lambda item: item[1].arrival_s)
    targets: dict[str, WorkloadRequest] = {}
    records: list[RequestRecord] = []
    now = 0.0
    next_arrival = 0
    num_steps = 0
    while next_arrival < len(specs) or scheduler.has_unfinished_requests:
        while next_arrival < len(specs) and specs[next_arrival][1].arrival_s <= now:
            index, spec = specs[next_arrival]
            next_arrival += 1
            request = _request(index, spec, config.slo_scale)
            if admission is not None and not admission.admit(request, spec.arrival_s):
                records.append(_rejected_record(request, spec))
                continue
            targets[request.request_id] = spec
            scheduler.add_request(request)
        if admission is not None:
            admission.settle(now)
        batch = scheduler.schedule(now)
        if not batch.sequences:
            if next_arrival >= len(specs):
                raise RuntimeError(
                    "the scheduler stalled with requests left; is the cache too small?"
                )
            now = max(now, specs[next_arrival][1].arrival_s)
            continue
        shape = StepShape(
            batch.num_prefill_tokens,
            batch.num_decode_tokens,
            sum(seq.seq_len for seq in batch.sequences),
        )
        duration = config.cost.predict(shape)
        if config.noise:
            duration *= 1 + noise.uniform(-config.noise, config.noise)
        now += duration
        num_steps += 1
        cost_model.update(shape, duration)
        num_samples = sum(1 for seq in batch.sequences if seq.sample)
        for request, _, _ in scheduler.update(batch, ExecutorOutput([0] * num_samples)):
            if request.first_token_time is None:
                request.first_token_time = now
                if admission is not None:
                    admission.output(request.request_id, finished=False)
            spec = targets[request.request_id]
            if request.num_output_tokens >= spec.output_len:
                reason = (
                    FinishReason.LENGTH if spec.output_len >= spec.max_tokens else FinishReason.STOP
                )
                scheduler.finish_request(request, reason, now)
                predictor.observe(request)
                records.append(_record(request, spec))
                if admission is not None:
                    admission.output(request.request_id, finished=True)
    return SimulationResult(
        policy,
        records,
        num_steps,
        scheduler.num_preemptions,
        cost_model.mean_abs_error_ratio,
        predictor.mean_abs_error_ratio,
    )


class SLOAdmission:
    """`baton serve`'s SLO admission control (app/admission.py) on the simulated clock: the
    same `TTFTForecast` ledger and rule, fed as the server's event loop feeds it (added at
    arrival, settled at the first token, dropped at the finish)."""

    def __init__(self, context: PolicyContext, factor: float):
        self.forecast = TTFTForecast(
            context.cost_model,
            context.max_num_batched_tokens,
            context.max_num_seqs,
            context.max_wait_s,
        )
        self.factor = factor
        # The event loop receives a step's outputs when the step ends, so a request arriving
        # during a step is judged on the ledger as of the step before: the outputs of the step
        # just simulated wait here until that step's arrivals are judged.
        self._pending: list[tuple[str, bool]] = []

    def admit(self, request: Request, now: float) -> bool:
        """Whether the server would accept `request` arriving at `now`; if so it is in flight."""
        ttft_ms = request.slo.ttft_ms
        num_prompt_tokens = request.num_prompt_tokens
        if ttft_ms is not None:
            forecast = self.forecast.predict(num_prompt_tokens, ttft_ms, now)
            if forecast.refuses(ttft_ms, self.factor):
                return False
        self.forecast.add(request.request_id, num_prompt_tokens, request.slo, now)
        return True

    def output(self, request_id: str, *, finished: bool) -> None:
        self._pending.append((request_id, finished))

    def settle(self, now: float) -> None:
        for request_id, finished in self._pending:
            if finished:
                self.forecast.remove(request_id, now)
            else:
                self.forecast.first_token(request_id, now)
        self._pending.clear()


def _request(index: int, spec: WorkloadRequest, slo_scale: float) -> Request:
    request_class = spec.request_class
    # Distinct token ids per request, so no two prompts share a cached block by accident.
    start = index * 7919
    prompt = [(start + i) % 50_000 for i in range(spec.prompt_len)]
    return Request(
        f"sim-{index}",
        prompt,
        SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
        spec.arrival_s,
        request_class.priority,
        SLO(_scaled(request_class.ttft_ms, slo_scale), _scaled(request_class.tpot_ms, slo_scale)),
    )


def _scaled(target_ms: float | None, scale: float) -> float | None:
    return None if target_ms is None else target_ms * scale


def _record(request: Request, spec: WorkloadRequest) -> RequestRecord:
    return RequestRecord(
        spec.request_class.name,
        spec.arrival_s,
        request.num_output_tokens,
        request.slo.ttft_ms,
        request.slo.tpot_ms,
        request.first_scheduled_time,
        request.first_token_time,
        request.finish_time,
    )


def _rejected_record(request: Request, spec: WorkloadRequest) -> RequestRecord:
    arrival = spec.arrival_s
    return RequestRecord(
        spec.request_class.name,
        arrival,
        0,
        request.slo.ttft_ms,
        request.slo.tpot_ms,
        arrival,
        arrival,
        arrival,
        rejected=True,
    )


def summarize(records: list[RequestRecord]) -> dict[str, float | int | None]:
    """The figures `baton simulate` reports for a set of requests. Goodput and attainment count
    every arrival, a rejected one as missing its SLO; latencies are of the served ones."""
    if not records:
        return {"num_requests": 0}
    served = [r for r in records if not r.rejected]
    start = min(r.arrival_s for r in records)
    end = max(r.finish_s for r in records)
    duration = max(end - start, 1e-9)
    met = sum(r.slo_met for r in records)
    ttfts = sorted(r.ttft_ms for r in served)
    tpots = sorted(r.tpot_ms for r in served)
    return {
        "num_requests": len(records),
        "rejected": len(records) - len(served),
        "duration_s": duration,
        "throughput_rps": len(served) / duration,
        "goodput_rps": met / duration,
        "slo_attainment": met / len(records),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "ttft_max_ms": ttfts[-1] if ttfts else math.nan,
        "tpot_p50_ms": percentile(tpots, 50),
        "tpot_p99_ms": percentile(tpots, 99),
        "max_wait_ms": max((r.wait_ms for r in served), default=math.nan),
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default."""
    if not sorted_values:
        return math.nan
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
