"""Triton kernels of the fused logic layer (imported only when a Triton backend runs)."""
