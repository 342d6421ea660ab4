"""cgtool: plan and profile CUDA graph capture for LLM serving."""

__version__ = "0.1.0"
