"""OpenAI's Responses API (`POST /v1/responses`): its body mapped onto the chat machinery, its
output items and typed stream events."""
