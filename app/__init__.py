"""Asyncio front end: HTTP and WebSocket routes, the bridge to the step thread, the CLI."""
