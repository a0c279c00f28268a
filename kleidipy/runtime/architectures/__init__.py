"""The architectures kleidipy runs, one module each (its model, its tensors, its rows): llama and qwen2 in
``llama``, gemma3 in ``gemma3``. Adding an architecture is adding a module and listing its rows here."""

from __future__ import annotations

from kleidipy.runtime.architecture import Architecture
from kleidipy.runtime.architectures import gemma3, llama

ARCHITECTURES: dict[str, Architecture] = {row.name: row for row in (*llama.ROWS, *gemma3.ROWS)}
