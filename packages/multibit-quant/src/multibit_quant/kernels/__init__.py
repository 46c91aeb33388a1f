"""Triton kernels (imported only when a Triton backend runs)."""
