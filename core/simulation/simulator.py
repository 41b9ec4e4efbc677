"""The discrete-event simulator behind `baton simulate`: the real `Engine`, with its scheduler,
KV block pool, policies and stop conditions, on a `SimulatedExecutor` whose simulated clock
advances each step by the duration the machine's true step-cost coefficients give it. No model
runs, so thousands of requests simulate in seconds.

The policies see what they would see in a server: the engine's own step-cost model, seeded by
the same warm-up profile and refitted by its step listener to every simulated step, and its
output-length predictor learning from finished requests. A request ends when the simulated
model ends its answer at the workload's output length (EOS), or at its `max_tokens`. With the
`slo` policy, arrivals pass the server's SLO admission control first, on the simulated clock.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.outputs import RequestOutput
from baton.core.request import SLO, EngineRequest
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.scheduling.step_cost_profile import profile_shapes, warm_up
from baton.core.scheduling.ttft_forecast import TTFTForecast
from baton.core.simulation.records import RequestRecord, record_of, rejected_record
from baton.core.simulation.simulated_executor import SimulatedClock, SimulatedExecutor
from baton.core.simulation.workloads import RequestClass, TraceClass, WorkloadRequest

# Roughly an 8B model on one H100-class GPU: 10 ms per step, 16k prefill tokens/s, 0.2 ms per
# decoding sequence and 0.1 µs per KV entry read.
DEFAULT_COST = CostCoefficients(
    base_s=0.010, per_prefill_token_s=6e-5, per_decode_token_s=2e-4, per_context_token_s=1e-7
)
# Prompt token ids cycle below this; the simulated model's EOS is the one id above them.
PROMPT_VOCAB = 50_000
EOS_TOKEN_ID = PROMPT_VOCAB
VOCAB_SIZE = PROMPT_VOCAB + 1
# The context length the warm-up profile's step shapes span, as for a server with an 8k model.
PROFILE_MODEL_LEN = 8192


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
    # With speculation: the chance the simulated model accepts a draft token it agrees with.
    # Its answers are filler a prompt lookup always predicts, so this is the acceptance rate.
    draft_acceptance: float = 1.0


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
    engine, executor = build_engine(policy, config)
    clock = executor.clock
    engine_config = engine.config
    admission = None
    if policy == "slo" and engine_config.slo_admission_factor > 0:
        admission = SLOAdmission(engine, engine_config.slo_admission_factor)
    records: list[RequestRecord] = []
    class_names: dict[str, str] = {}
    engine.finish_listeners.append(
        lambda request, _: records.append(record_of(request, class_names[request.request_id]))
    )
    specs = sorted(enumerate(workload), key=lambda item: item[1].arrival_s)
    next_arrival = 0
    while next_arrival < len(specs) or engine.has_unfinished_requests:
        now = clock.now
        while next_arrival < len(specs) and specs[next_arrival][1].arrival_s <= now:
            index, spec = specs[next_arrival]
            next_arrival += 1
            request_id = f"sim-{index}"
            class_names[request_id] = spec.request_class.name
            slo = class_slo(spec.request_class, config.slo_scale)
            if admission is not None and not admission.admit(
                request_id, spec.prompt_len, slo, spec.arrival_s
            ):
                records.append(
                    rejected_record(
                        request_id, spec.request_class.name, spec.arrival_s, spec.arrival_s, slo
                    )
                )
                continue
            submit(engine, executor, request_id, index, spec, slo)
        if admission is not None:
            admission.settle(now)
        num_steps = engine.num_steps
        outputs = engine.step()
        if engine.num_steps == num_steps:
            if next_arrival >= len(specs):
                raise RuntimeError(
                    "the scheduler stalled with requests left; is the cache too small?"
                )
            clock.now = max(now, specs[next_arrival][1].arrival_s)
            continue
        if admission is not None:
            admission.receive(outputs)
    return SimulationResult(
        policy,
        records,
        engine.num_steps,
        engine.scheduler.num_preemptions,
        engine.step_cost_model.mean_abs_error_ratio,
        engine.length_predictor.mean_abs_error_ratio,
    )


def build_engine(
    policy: str, config: SimulationConfig, seed_offset: int = 0
) -> tuple[Engine, SimulatedExecutor]:
    """The real `Engine` under `policy` on a simulated executor with a clock of its own, its
    cost model warmed up as a server's is; `seed_offset` gives each replica its own noise."""
    clock = SimulatedClock()
    engine_config = dataclasses.replace(config.engine, scheduling_policy=policy)
    executor = SimulatedExecutor(
        config.num_kv_blocks,
        engine_config.block_size,
        VOCAB_SIZE,
        clock,
        config.cost,
        noise=config.noise,
        seed=config.seed + seed_offset,
        eos_token_id=EOS_TOKEN_ID,
        draft_acceptance=config.draft_acceptance,
    )
    engine = Engine(
        engine_config,
        executor,
        # The simulated model has no context limit: the KV cache is the only one.
        max_model_len=sys.maxsize,
        vocab_size=VOCAB_SIZE,
        eos_token_ids=[EOS_TOKEN_ID],
        clock=clock,
    )
    warm_up(
        engine.step_cost_model,
        config.cost.predict,
        profile_shapes(
            engine_config.max_num_batched_tokens, engine_config.max_num_seqs, PROFILE_MODEL_LEN
        ),
    )
    return engine, executor


class SLOAdmission:
    """`baton serve`'s SLO admission control (app/engine/admission.py) on the simulated clock: the
    same `TTFTForecast` ledger and rule, fed as the server's event loop feeds it (added at
    arrival, settled at the first token, dropped at the finish)."""

    def __init__(self, engine: Engine, factor: float):
        config = engine.config
        self.forecast = TTFTForecast(
            engine.step_cost_model,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.max_wait_ms / 1000,
        )
        self.factor = factor
        self.lifetime = engine.lifetime
        self._lifetime_s = 0.0
        # The event loop receives a step's outputs when the step ends, so a request arriving
        # during a step is judged on the ledger as of the step before: the outputs of the step
        # just simulated wait here until that step's arrivals are judged.
        self._pending: list[tuple[str, bool]] = []

    def admit(self, request_id: str, num_prompt_tokens: int, slo: SLO, now: float) -> bool:
        """Whether the server would accept a request arriving at `now`; if so it is in flight."""
        ttft_ms = slo.ttft_ms
        if ttft_ms is not None:
            forecast = self.forecast.predict(num_prompt_tokens, ttft_ms, now)
            if forecast.refuses(ttft_ms, self.factor):
                return False
        self.forecast.add(request_id, num_prompt_tokens, slo, now)
        return True

    def receive(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, as the event loop gets them; only a first token and a finish
        change the ledger; with them comes the engine's published mean lifetime."""
        self._lifetime_s = self.lifetime.mean_s
        for output in outputs:
            if output.num_output_tokens == 1 and output.new_token_ids:
                self._pending.append((output.request_id, False))
            if output.finished:
                self._pending.append((output.request_id, True))

    def settle(self, now: float) -> None:
        self.forecast.lifetime_s = self._lifetime_s
        for request_id, finished in self._pending:
            if finished:
                self.forecast.remove(request_id)
            else:
                self.forecast.first_token(request_id, now)
        self._pending.clear()


def submit(
    engine: Engine,
    executor: SimulatedExecutor,
    request_id: str,
    index: int,
    spec: WorkloadRequest,
    slo: SLO,
    hand_off: bool = False,
) -> None:
    """Queue workload request `index` on `engine`; with `hand_off`, for its prefill only."""
    prompt = prompt_tokens(index, spec)
    # An answer as long as max_tokens is cut there (length), a shorter one ends on its own.
    executor.script_answer(
        request_id, spec.output_len if spec.output_len < spec.max_tokens else None
    )
    try:
        request = EngineRequest(
            request_id,
            prompt,
            SamplingParams(max_tokens=spec.max_tokens),
            priority=spec.request_class.priority,
            slo=slo,
            arrival_time=spec.arrival_s,
        )
        engine.add_request(engine.validator.validate(request), hand_off=hand_off)
    except InvalidRequestError as error:
        raise ValueError(f"workload request {index} cannot be simulated: {error}") from None


def prompt_tokens(index: int, spec: WorkloadRequest) -> list[int]:
    """Request `index`'s prompt: its shared prefix's tokens, if any, then its own. Distinct
    ids per request (rising) and per prefix (falling), so no two prompts share a cached block
    by accident: blocks are hashed chained from the first, and no own run equals a prefix."""
    start = index * 7919
    own = [(start + i) % PROMPT_VOCAB for i in range(spec.prompt_len - spec.prefix_len)]
    if spec.prefix_group is None:
        return own
    top = PROMPT_VOCAB - 1 - spec.prefix_group * 104_729
    return [(top - i) % PROMPT_VOCAB for i in range(spec.prefix_len)] + own


def class_slo(request_class: RequestClass | TraceClass, slo_scale: float) -> SLO:
    return SLO(_scaled(request_class.ttft_ms, slo_scale), _scaled(request_class.tpot_ms, slo_scale))


def _scaled(target_ms: float | None, scale: float) -> float | None:
    return None if target_ms is None else target_ms * scale
