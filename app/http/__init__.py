"""The HTTP server: the Starlette application, uvicorn around it, and the limits and security
checks every request passes.
"""
