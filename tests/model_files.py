"""The real GGUF models the tests use: pulled into the session's model cache on first use exactly as
`kleidipy pull` does it, and their `kleidipy quantize --pure` variants (made once per session)."""

import tempfile
from functools import cache
from pathlib import Path

from kleidipy.runtime.pull import pull
from kleidipy.tools.quantize import quantize_gguf

SMOLLM2 = "smollm2-135m-instruct"
QWEN25 = "qwen2.5-coder-0.5b-instruct"
GEMMA3 = "gemma3-270m"

_OUT = tempfile.TemporaryDirectory(prefix="kleidipy-quantize-")  # removed when the test session ends


@cache
def model_file(name: str) -> Path:
    """Path of catalogue model ``name``, pulled now if it is not in the cache yet."""
    return pull(name, progress=False)


@cache
def requantized(model_name: str, qtype: str) -> Path:
    """``kleidipy quantize --pure`` of catalogue model ``model_name`` to ``qtype`` (once per test session)."""
    dst = Path(_OUT.name) / f"{model_name}.pure-{qtype}.gguf"
    quantize_gguf(model_file(model_name), dst, qtype, pure=True, progress=False)
    return dst
