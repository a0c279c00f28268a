"""The real GGUF models the tests use, pulled into the cache on first use exactly as `kleidipy pull` does it."""

from functools import cache
from pathlib import Path

from kleidipy.model.pull import pull

SMOLLM2 = "smollm2-135m-instruct"
QWEN25 = "qwen2.5-coder-0.5b-instruct"


@cache
def model_file(name: str) -> Path:
    """Path of catalogue model ``name``, pulled now if it is not in the cache yet."""
    return pull(name, progress=False)
