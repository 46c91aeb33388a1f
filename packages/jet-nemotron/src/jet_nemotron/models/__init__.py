"""Hybrid Hugging Face causal LMs: configuration, cache, attention, model and conversion."""
