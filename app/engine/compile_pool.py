"""Where output constraints compile: one thread of their own, never asyncio's default pool, so
tokenizing (and anything else on that pool) never waits behind a compile.

A compile is waited for at most `--grammar-compile-timeout` seconds, queue included, then
answered with a 400. A compile whose client left (or timed out) before it started never runs;
one already running cannot be interrupted (xgrammar holds the thread in C++ until it is done),
which is why the request bounds cap what a constraint may cost before it is queued
(docs/decisions.md). Its result then lands in the compiler's cache all the same.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from baton.app.engine.client import EngineClient
from baton.core.sampling_params import InvalidRequestError, SamplingParams

# One compile at a time: on a small machine a second would take the core the step thread
# runs on, and a queued compile costs nothing until it starts.
_POOL = ThreadPoolExecutor(1, thread_name_prefix="baton-compile")


async def compile_constraint(
    engine: EngineClient, params: SamplingParams, timeout_s: float
) -> SamplingParams:
    """`params` with its output constraint compiled on the compile thread; InvalidRequestError
    when it cannot compile or takes longer than `timeout_s`. Cancelling the caller cancels a
    compile that has not started."""
    constraint = params.structured_output
    assert constraint is not None
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(_POOL, engine.compile_structured_output, params)
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError:
        raise InvalidRequestError(
            f"{constraint.param} took longer than {timeout_s:g} s to compile into a grammar "
            "(--grammar-compile-timeout); simplify it",
            constraint.param,
        ) from None
