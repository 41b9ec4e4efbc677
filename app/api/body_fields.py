"""Building blocks of request bodies that every body model shares: the strict base model and
the bounded integer and name types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

# Integers travel on as 64-bit values (trace attributes, tensors); JSON allows any size.
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
# Client-chosen strings that are echoed back or logged are bounded, so none amplifies output.
MAX_NAME_CHARS = 256
Name = Annotated[StrictStr, Field(max_length=MAX_NAME_CHARS)]


class StrictModel(BaseModel):
    """A body part whose every field is honoured: unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
