"""The real GGUF models the tests use: pulled into the session's model cache on first use exactly as
`kleidipy pull` does it, and their `kleidipy quantize --pure` variants (made once per session)."""

import hashlib
import json
import tempfile
from functools import cache
from pathlib import Path

from paths import REFERENCE

from kleidipy.runtime.pull import pull
from kleidipy.tools.quantize import quantize_gguf

SMOLLM2 = "smollm2-135m-instruct"
QWEN25 = "qwen2.5-coder-0.5b-instruct"
GEMMA3 = "gemma3-270m"

#: models.json file entries by model key
FILES = {"smollm2": "SmolLM2-135M-Instruct", "qwen25": "Qwen2.5-Coder-0.5B-Instruct"}

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


def reference_entry(model: str, qtype: str) -> dict:
    """The models.json record of llama-quantize's --pure output for ``model`` ("smollm2"/"qwen25")."""
    name = f"{FILES[model]}.requant-pure-{qtype.upper()}.gguf"
    files = json.loads((REFERENCE / "models.json").read_text())["files"]
    return next(f for f in files if f["file"] == name)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()
