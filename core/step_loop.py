"""The step thread: drains a thread-safe inbox of adds, aborts and calls on the engine (such as
decoding a request another engine prefilled), steps the engine, and hands each iteration's
outputs for all requests, with the engine's stats snapshot, to one callback. Idle means blocked
on the inbox."""

from __future__ import annotations

import gc
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from baton.core.engine import INTERNAL_ERROR, Engine
from baton.core.engine_stats import EngineStats
from baton.core.outputs import RequestOutput
from baton.core.request import EngineRequest, FinishReason
from baton.core.sampling_params import InvalidRequestError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class AbortRequest:
    request_id: str


@dataclass(slots=True)
class PrefillOnly:
    """Add `request` to be prefilled only (`Engine.add_request(hand_off=True)`)."""

    request: EngineRequest


@dataclass(slots=True)
class EngineCall:
    """Run `work` on the engine between steps; its result or error settles `future`."""

    work: Callable[[Engine], Any]
    future: Future


class _Stop:
    """Inbox marker: finish the current step, cancel what is left, end the thread."""


class StepLoop:
    """Owns the engine on one thread; every other thread talks to it through `submit`/`abort`."""

    def __init__(
        self,
        engine: Engine,
        deliver: Callable[[list[RequestOutput], EngineStats], None],
        on_death: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.deliver = deliver
        self.on_death = on_death
        self._inbox: queue.SimpleQueue[
            EngineRequest | PrefillOnly | AbortRequest | EngineCall | _Stop
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Requests added since the last step that went through: the suspects when one fails.
        self._newcomers: list[str] = []

    def submit(self, request: EngineRequest, *, hand_off: bool = False) -> None:
        self._inbox.put(PrefillOnly(request) if hand_off else request)

    def call(self, work: Callable[[Engine], Any]) -> Future:
        """Run `work(engine)` on the step thread between steps; the future holds its result."""
        future: Future = Future()
        self._inbox.put(EngineCall(work, future))
        return future

    def abort(self, request_id: str) -> None:
        self._inbox.put(AbortRequest(request_id))

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._guarded_run, name="baton-step", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._inbox.put(_Stop())
        if self._thread is not None:
            self._thread.join(timeout)

    def _guarded_run(self) -> None:
        try:
            self.run()
        except BaseException as error:
            logger.exception("the step thread died")
            if self.on_death is not None:
                self.on_death(error)

    def run(self) -> None:
        # Everything alive now (model, tokenizer, engine) lives as long as the loop: keep the
        # cyclic collector from rescanning it, which shows up as step-time spikes.
        gc.freeze()
        while not self._stopping:
            outputs = self._drain_inbox(block=not self.engine.has_unfinished_requests)
            if self._stopping:
                break
            if self.engine.has_unfinished_requests:
                outputs.extend(self._step())
            # Each iteration did something (it drained a message or stepped): the outputs and
            # the state they leave go out together, the front end's only view of the engine.
            self.deliver(outputs, self.engine.make_stats())
        self._cancel_all()

    def _drain_inbox(self, block: bool) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        while True:
            try:
                message = self._inbox.get(block=block)
            except queue.Empty:
                return outputs
            block = False
            if isinstance(message, _Stop):
                self._stopping = True
                return outputs
            if isinstance(message, AbortRequest):
                aborted = self.engine.abort_request(message.request_id)
                if aborted is not None:
                    outputs.append(aborted)
                continue
            if isinstance(message, EngineCall):
                _settle(message, self.engine)
                continue
            hand_off = isinstance(message, PrefillOnly)
            if isinstance(message, PrefillOnly):
                message = message.request
            try:
                self.engine.add_request(message, hand_off=hand_off)
            except InvalidRequestError as error:
                outputs.append(_rejected(message, str(error)))
            except Exception:
                # A request its caller failed to validate: a bug, which fails that request
                # alone rather than the thread every other request runs on.
                logger.exception("request %s could not be queued", message.request_id)
                outputs.append(_rejected(message, INTERNAL_ERROR))
            else:
                self._newcomers.append(message.request_id)

    def _step(self) -> list[RequestOutput]:
        """One engine step. A forward that fails is isolated to its sequence inside the engine;
        anything else that fails (scheduling, a policy) fails the requests that joined since
        the last good step, the only new input, and only if there were none, the running ones."""
        try:
            outputs = self.engine.step()
        except Exception:
            logger.exception("engine step failed")
            scheduler = self.engine.scheduler
            suspects = [rid for rid in self._newcomers if rid in scheduler.requests]
            if not suspects:
                suspects = [request.request_id for request in scheduler.running]
            outputs = [
                output
                for output in (self.engine.fail_request(rid, INTERNAL_ERROR) for rid in suspects)
                if output is not None
            ]
        self._newcomers.clear()
        return outputs

    def _cancel_all(self) -> None:
        outputs = []
        for request_id in list(self.engine.scheduler.requests):
            output = self.engine.abort_request(request_id)
            if output is not None:
                outputs.append(output)
        if outputs:
            self.deliver(outputs, self.engine.make_stats())


def _settle(call: EngineCall, engine: Engine) -> None:
    if not call.future.set_running_or_notify_cancel():
        return
    try:
        call.future.set_result(call.work(engine))
    except Exception as error:
        # The caller gets the error; the thread every request runs on goes on.
        call.future.set_exception(error)


def _rejected(request: EngineRequest, message: str) -> RequestOutput:
    return RequestOutput(
        request.request_id,
        [],
        "",
        len(request.prompt_token_ids),
        0,
        finished=True,
        finish_reason=FinishReason.ERROR,
        error=message,
    )
