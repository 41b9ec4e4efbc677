"""Request workloads shared by the simulator (`baton simulate`) and the benchmark client
(`baton bench`): request classes with log-normal prompt and output lengths and their own SLO
targets and priority, mixed by weight, and Poisson or bursty (gamma) arrivals; for the
simulator, variants where a share of requests open with a shared prompt prefix. Recorded
traces (core/simulation/trace.py) become the same `WorkloadRequest`s."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LengthDistribution:
    """Log-normal around `median` (sigma of the log), clipped to [1, `ceiling`]."""

    median: int
    sigma: float
    ceiling: int

    def draw(self, rng: random.Random) -> int:
        value = rng.lognormvariate(math.log(self.median), self.sigma)
        return max(1, min(self.ceiling, round(value)))


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One kind of request: its lengths, its `max_tokens` cap, its SLO targets and priority
    (a lower value is more urgent)."""

    name: str
    prompt: LengthDistribution
    output: LengthDistribution
    max_tokens: int
    ttft_ms: float | None
    tpot_ms: float | None
    priority: int


# Interactive chat wants its first token fast and a steady reading pace; batch work (RAG over
# long documents, long generations) tolerates seconds before its first token.
CHAT = RequestClass(
    "interactive",
    LengthDistribution(64, 0.6, 512),
    LengthDistribution(128, 0.6, 512),
    512,
    ttft_ms=500,
    tpot_ms=50,
    priority=0,
)
RAG = RequestClass(
    "rag",
    LengthDistribution(1536, 0.3, 4096),
    LengthDistribution(128, 0.5, 512),
    512,
    ttft_ms=5000,
    tpot_ms=150,
    priority=1,
)
LONG_GENERATION = RequestClass(
    "long-generation",
    LengthDistribution(64, 0.5, 512),
    LengthDistribution(1024, 0.3, 2048),
    2048,
    ttft_ms=5000,
    tpot_ms=150,
    priority=1,
)

# Chat's lengths and targets with the output's spread set apart (static batching loses to
# continuous batching by the spread of the lengths within a batch, docs/benchmarks.md): every
# answer as long as the median, and a long tail about as long on average.
FIXED = dataclasses.replace(
    CHAT,
    name="fixed",
    prompt=LengthDistribution(64, 0.0, 64),
    output=LengthDistribution(128, 0.0, 128),
)
LONG_TAIL = dataclasses.replace(
    CHAT, name="long-tail", output=LengthDistribution(64, 1.2, 2048), max_tokens=2048
)

WORKLOADS: dict[str, list[tuple[RequestClass, float]]] = {
    "chat": [(CHAT, 1.0)],
    "rag": [(RAG, 1.0)],
    "mixed": [(CHAT, 0.7), (RAG, 0.3)],
    "long-generation": [(LONG_GENERATION, 1.0)],
    "fixed": [(FIXED, 1.0)],
    "long-tail": [(LONG_TAIL, 1.0)],
}


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """A `share` of requests open with one of `count` shared prefixes of `length` tokens (a
    system prompt, few-shot examples, a document asked about again), picked uniformly."""

    share: float
    count: int
    length: int


# Simulator-only variants: a base workload's requests, a share of them given a shared prefix
# in front of their own prompt (production chat shares system prompts). Drawn from their own
# generator, so the base requests are the base workload's, length for length.
PREFIX_WORKLOADS: dict[str, tuple[str, SharedPrefixes]] = {
    "mixed-prefix": ("mixed", SharedPrefixes(share=0.3, count=16, length=512)),
}
# The classes a trace row may name to take their targets and priority.
REQUEST_CLASSES = {c.name: c for c in (CHAT, RAG, LONG_GENERATION)}


@dataclass(frozen=True, slots=True)
class TraceClass:
    """The class of a recorded request: its name, SLO targets and priority. Unlike a
    `RequestClass` it draws no lengths: the trace row gives them."""

    name: str
    ttft_ms: float | None
    tpot_ms: float | None
    priority: int


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One request to issue: when, how long its prompt is, how many tokens it will generate
    (`output_len`, its "true" length) and may generate (`max_tokens`), and its class, which
    gives its name, SLO targets and priority."""

    arrival_s: float
    prompt_len: int
    output_len: int
    max_tokens: int
    request_class: RequestClass | TraceClass
    # The shared prefix the prompt opens with (its first `prefix_len` of `prompt_len` tokens),
    # or None for a prompt all its own.
    prefix_group: int | None = None
    prefix_len: int = 0


def arrival_times(
    num_requests: int, rate: float, rng: random.Random, burstiness: float = 1.0
) -> list[float]:
    """Arrival times at `rate` per second; gaps are gamma-distributed with shape `burstiness`
    (1 is Poisson, below 1 burstier, above 1 more regular). An infinite rate sends all at 0."""
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * num_requests
    if rate <= 0:
        raise ValueError(f"the request rate must be > 0, got {rate}")
    times, now = [], 0.0
    for _ in range(num_requests):
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(now)
    return times


def arrival_rng(seed: int) -> random.Random:
    """The generator of arrival gaps for `seed`, apart from the lengths' so that the simulator
    and the benchmark client draw the same requests at the same times."""
    return random.Random(f"arrivals-{seed}")


def sample_requests(
    workload: str,
    num_requests: int,
    rate: float,
    seed: int = 0,
    burstiness: float = 1.0,
    length_scale: float = 1.0,
) -> list[WorkloadRequest]:
    """The same seed gives the same requests at the same times, whatever the policy.
    `length_scale` shrinks (or grows) every prompt and output, for small models and CPUs."""
    if workload in PREFIX_WORKLOADS:
        base, prefixes = PREFIX_WORKLOADS[workload]
        requests = sample_requests(base, num_requests, rate, seed, burstiness, length_scale)
        return with_shared_prefixes(requests, prefixes, seed, length_scale)
    if workload not in WORKLOADS:
        names = [*WORKLOADS, *PREFIX_WORKLOADS]
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(names)}")
    if length_scale <= 0:
        raise ValueError(f"the length scale must be > 0, got {length_scale}")
    rng = random.Random(seed)
    classes, weights = zip(*WORKLOADS[workload], strict=True)
    requests = []
    for arrival in arrival_times(num_requests, rate, arrival_rng(seed), burstiness):
        request_class = rng.choices(classes, weights)[0]
        prompt_len = request_class.prompt.draw(rng)
        output_len = min(request_class.output.draw(rng), request_class.max_tokens)
        requests.append(
            WorkloadRequest(
                arrival,
                scale_length(prompt_len, length_scale),
                scale_length(output_len, length_scale),
                scale_length(request_class.max_tokens, length_scale),
                request_class,
            )
        )
    return requests


def with_shared_prefixes(
    requests: list[WorkloadRequest], prefixes: SharedPrefixes, seed: int, length_scale: float
) -> list[WorkloadRequest]:
    """`requests` with a share of them opening with a shared prefix, longer by its length."""
    rng = random.Random(f"prefixes-{seed}")
    length = scale_length(prefixes.length, length_scale)
    shared = []
    for request in requests:
        if rng.random() < prefixes.share:
            request = dataclasses.replace(
                request,
                prompt_len=request.prompt_len + length,
                prefix_group=rng.randrange(prefixes.count),
                prefix_len=length,
            )
        shared.append(request)
    return shared


def cap_max_tokens(requests: list[WorkloadRequest], cap: str) -> list[WorkloadRequest]:
    """`requests` with `max_tokens` as a client sets it: `class` leaves each class's cap,
    `exact` sets each request's own output length (the tightest cap, as if the client knew
    it), and a number sets that cap on every request (an answer longer is cut there)."""
    if cap == "class":
        return requests
    if cap == "exact":
        return [dataclasses.replace(r, max_tokens=r.output_len) for r in requests]
    if not cap.isdigit() or int(cap) < 1:
        raise ValueError(f"--max-tokens takes class, exact or a number of tokens >= 1, got {cap!r}")
    limit = int(cap)
    return [
        dataclasses.replace(r, output_len=min(r.output_len, limit), max_tokens=limit)
        for r in requests
    ]


@dataclass(frozen=True, slots=True)
class LengthStats:
    """The mean and coefficient of variation (standard deviation / mean) of a workload's prompt
    and output lengths: static batching pays for the spread of both."""

    prompt_mean: float
    prompt_cv: float
    output_mean: float
    output_cv: float

    @classmethod
    def of(cls, requests: list[WorkloadRequest]) -> LengthStats:
        prompts = [r.prompt_len for r in requests]
        outputs = [r.output_len for r in requests]
        prompt_mean, output_mean = statistics.fmean(prompts), statistics.fmean(outputs)
        return cls(
            prompt_mean,
            statistics.pstdev(prompts) / prompt_mean,
            output_mean,
            statistics.pstdev(outputs) / output_mean,
        )


def scale_length(length: int, scale: float) -> int:
    """A token count times `scale`, never below one token."""
    return max(1, round(length * scale))
