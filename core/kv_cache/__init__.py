"""The KV block pool, per-request block tables over it with prefix caching, and the host memory
that sizes it.
"""
