"""The front end's record of the requests in flight over the replicas (`baton serve --replicas
N`): each one's output stream, the replica that has it now, the whole request while it has sent
no token (so that it can run elsewhere if its replica dies), and its trace context, which stays
in the front end: the span is made here from the finished request its replica sends back. Lives
on the event loop, as app/replicas/replicated_engine.py and app/replicas/replica_moves.py, which
share it, do."""

from __future__ import annotations

from dataclasses import dataclass, field

from baton.app.engine.client import EngineDeadError, EngineStream
from baton.core.request import EngineRequest


@dataclass
class RequestTable:
    streams: dict[str, EngineStream] = field(default_factory=dict)
    replica_of: dict[str, int] = field(default_factory=dict)
    unanswered: dict[str, EngineRequest] = field(default_factory=dict)
    trace_contexts: dict[str, object] = field(default_factory=dict)

    def end_with_error(self, request_id: str, message: str) -> None:
        """End a request's stream with `message`, its client's answer; its span is not made."""
        self.trace_contexts.pop(request_id, None)
        stream = self.streams.get(request_id)
        if stream is not None:
            stream.put(EngineDeadError(message))
