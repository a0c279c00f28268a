"""kleidipy: KleidiAI-compatible quantized matmul micro-kernels and an LLM runtime built on them.

``kleidipy.load(name_or_path)`` gives an :class:`~kleidipy.api.LLM` with ``chat`` and ``complete``
(see :mod:`kleidipy.api`); it is imported on first use, so ``import kleidipy`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kleidipy.core.hwcaps import pin_numba_features
from kleidipy.core.jit_cache import install_with_numba

pin_numba_features()  # before numba is imported: no SVE code generation on aarch64 (an LLVM abort, see there)
install_with_numba()  # before anything is compiled: numba's cache of kleidipy functions keyed by all its sources

if TYPE_CHECKING:
    from kleidipy.api import load

__version__ = "0.1.0"
__all__ = ["load"]


def __getattr__(name: str) -> Any:
    if name == "load":
        from kleidipy.api import load

        return load
    raise AttributeError(f"module 'kleidipy' has no attribute {name!r}")
