"""The ops: gated delta rule (chunked, fused recurrent, naive) and the dynamic causal conv."""
