"""OpenAI-shaped errors: one exception type for everything a client can get wrong, and the
JSON body every error response carries."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from baton.core.outputs import RequestOutput
from baton.core.request import FinishReason

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        return Response(
            orjson.dumps(self.body()),
            status_code=self.status,
            headers=self.headers,
            media_type="application/json",
        )


def output_error(output: RequestOutput) -> APIError | None:
    """What a client gets for an engine output that ends its request without an answer:
    429 when SLO admission control refused it after queueing (the server is overloaded, as at
    arrival), 500 when it failed inside the engine; None for any other output."""
    if output.finish_reason is FinishReason.REFUSED:
        return APIError(
            429, output.error or "", code="rate_limit_error", headers={"Retry-After": "1"}
        )
    if output.finish_reason is FinishReason.ERROR:
        return APIError(500, output.error or "the request failed inside the engine")
    return None
