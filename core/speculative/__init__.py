"""Speculative decoding's core side: where draft tokens come from and how often they are right."""
