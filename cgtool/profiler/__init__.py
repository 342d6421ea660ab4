"""Measuring graphs: memory (allocator, graph pool, NVML), latency (CUDA events), kernels."""
