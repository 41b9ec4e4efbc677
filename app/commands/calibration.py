"""Where `baton simulate` gets a real machine's step-cost coefficients: fitted offline to a
model it loads (`--calibrate`), or read off a running server that fitted them to its own steps
(`--calibrate-from`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.request import EngineRequest
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.scheduling.step_cost_profile import profile_executor
from baton.core.simulation.workloads import WorkloadRequest

# Timed passes over the profile's step shapes when calibrating to a model (a server takes one).
CALIBRATION_ROUNDS = 3


def calibrated_coefficients(
    model_dir: str, device: str, config: EngineConfig, workload: list[WorkloadRequest]
) -> CostCoefficients:
    """The coefficients fitted to `model_dir`'s steps on `device`: the profile's step shapes,
    then `workload` served offline."""
    from baton.app.llm import build_engine  # torch loads only when calibrating on a real model

    engine = build_engine(model_dir, config, device)
    model = engine.step_cost_model
    profile_executor(
        model,
        engine.executor,
        config.max_num_batched_tokens,
        config.max_num_seqs,
        engine.max_model_len,
        engine.vocab_size,
        rounds=CALIBRATION_ROUNDS,
    )
    _serve_offline(engine, workload)
    return model.current


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
        # A server from before the grammar term reports none.
        per_constrained_row_s=cost.get("grammar_us_per_row", 0.0) / 1e6,
    )


def _serve_offline(engine: Engine, workload: list[WorkloadRequest]) -> None:
    """Serve a slice of the workload offline so the model also fits to steps shaped like the
    real ones (the profile's synthetic shapes may be far from them)."""
    for index, spec in enumerate(workload):
        output_len = min(spec.output_len, engine.max_model_len // 2)
        prompt_len = max(1, min(spec.prompt_len, engine.max_model_len - output_len - 1))
        prompt = [(index * 31 + i) % engine.vocab_size for i in range(prompt_len)]
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        request = EngineRequest(f"calibrate-{index}", prompt, params)
        engine.add_request(engine.validator.validate(request))
    while engine.has_unfinished_requests:
        engine.step()


def format_cost(cost: CostCoefficients) -> str:
    return (
        f"base={cost.base_s:.3g},prefill={cost.per_prefill_token_s:.3g},"
        f"decode={cost.per_decode_token_s:.3g},context={cost.per_context_token_s:.3g},"
        f"grammar={cost.per_constrained_row_s:.3g}"
    )
