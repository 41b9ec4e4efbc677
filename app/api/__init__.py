"""The routes: OpenAI-compatible completions and chat over SSE, the WebSocket protocol, and their
request and response shapes.
"""
