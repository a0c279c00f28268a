"""kleidipy: KleidiAI-compatible quantized matmul micro-kernels and an LLM runtime built on them."""

__version__ = "0.1.0"
