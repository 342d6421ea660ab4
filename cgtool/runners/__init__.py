"""CUDA graph runners: decode graphs per batch size, piecewise graphs per token count."""
