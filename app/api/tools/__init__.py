"""Tool calls: parsed out of a model's text in its template's format, or read from the output a
forced choice's grammar bounds, as OpenAI's stream deltas and final message."""
