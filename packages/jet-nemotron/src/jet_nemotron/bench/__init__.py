"""Side-by-side benchmarks: the gated delta rule kernels and generation throughput."""
