"""Qwen2 (Yang et al., 2024) as llama.cpp runs it: the Llama decoder block with two differences,

* the q, k and v projections have biases (required), and
* RoPE rotates halves of each head (NEOX: pairs (x[i], x[i + n_rot/2])) instead of adjacent pairs;

the LM head is ``output.weight`` when the file has one, else the tied ``token_embd.weight``. Both differences come
from the architecture table in :mod:`kleidipy.runtime.gguf_file` (RoPE type, required biases), so the model is built
exactly as :class:`~kleidipy.runtime.llama.Llama` builds it.
"""

from __future__ import annotations

from kleidipy.runtime.llama import Llama


class Qwen2(Llama):
    """A qwen2-architecture model from a GGUF file."""

    architecture = "qwen2"
