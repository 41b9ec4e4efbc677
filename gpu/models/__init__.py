"""Model definitions: Baton's native decoder, its MoE MLP, int8 weights, the CPU's fused layers,
and transformers' modeling code over the paged cache.
"""
