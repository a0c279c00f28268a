"""The architectures kleidipy runs, one module each (its model, its tensor table, its rows): llama and qwen2 in
``llama``; qwen3, smollm3, phi3 and gemma3 in their own. Adding an architecture is adding a module: its ``ROWS`` are
collected here."""

from __future__ import annotations

import importlib
import pkgutil

from kleidipy.runtime.architecture import Architecture

ARCHITECTURES: dict[str, Architecture] = {
    row.name: row
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__))
    for row in importlib.import_module(f"{__name__}.{module}").ROWS
}
