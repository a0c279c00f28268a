"""The record a KleidiAI family package declares, and which :mod:`kleidipy.kernels.catalogue` discovers.

A family (``kleidipy/kernels/<family>/``, as KleidiAI's ``kai/ukernels/matmul/<family>/``) owns its packers and
matmul kernels (``ukernels``), their numba code (``jit``, ``vnni``), their instruction programs for the emulator
(``isa``), the adaptor from GGML weight bytes to its RHS packer's inputs (``ggml``) and its native tiles
(``neon``, ``sme2``) and its kernels' routines in the compiled plan (``node``). Its ``__init__`` states
all of that in one :class:`Family`; adding a family is adding one folder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
from gguf import GGMLQuantizationType as GGMLType
from llvmlite import ir

from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.native import NativeIsa
from kleidipy.core.node import NodeKernel
from kleidipy.core.packers import Packer, RhsPacker

#: (GGML type, raw tensor bytes, n, k, RHS packer, execution) -> (rhs, packer keywords)
FromGGML = Callable[[GGMLType, np.ndarray, int, int, RhsPacker, str], tuple[np.ndarray, dict]]
#: (float weights [n, k], RHS packer) -> (rhs, packer keywords): the family's weight format made from floats
FromFloat = Callable[[np.ndarray, RhsPacker], tuple[np.ndarray, dict]]
#: (kernel, packed RHS, row ids, n, k, execution=) -> float32 [len(rows), k]: GET_ROWS from packed weights
GetRows = Callable[..., np.ndarray]
#: (kernel, k) -> the kernel's routines in the compiled plan (None: it has none)
Node = Callable[[MatmulKernel, int], NodeKernel | None]


@dataclass(frozen=True)
class Family:
    """One family: its kernels and packers, the GGML types it takes and how, and its emulator programs."""

    name: str
    kernels: tuple[MatmulKernel, ...]
    packers: tuple[Packer, ...]
    #: GGML weight types whose bytes :attr:`from_ggml` turns into RHS packer inputs (empty: none)
    ggml_types: tuple[GGMLType, ...] = ()
    from_ggml: FromGGML | None = None
    from_float: FromFloat | None = None
    #: kernel name -> instruction program (run by :mod:`kleidipy.emulator`)
    programs: Mapping[str, Callable] = field(default_factory=dict)
    #: the family's native-tile modules (``neon``, ``sme2``): each has ``kernel_tile(kernel, isa)`` -> the LLVM
    #: module (or its IR text) of the kernel's tile for a :class:`~kleidipy.core.native.NativeIsa`, or None
    native: tuple[ModuleType, ...] = ()
    #: the compiled plan's routines of a kernel (``node.node``, :mod:`kleidipy.core.node`; None: the plan runs none
    #: of the family's kernels)
    node: Node | None = None
    #: a GEMM's output row is bit for bit the family's GEMV of that row alone (integer dot products of rows
    #: quantized one by one, one float epilogue per output): a draft may be verified by the GEMM
    exact_rows: bool = False
    #: the weight values of a packed RHS (``get_rows(kernel, packed, rows, n, k, execution=...)``; None: not read back)
    get_rows: GetRows | None = None

    def native_tile(self, kernel: MatmulKernel, isa: NativeIsa) -> ir.Module | str | None:
        """The LLVM module (or IR text) of a kernel's native tile for ``isa`` (None: the family has none)."""
        return next((t for t in (m.kernel_tile(kernel, isa) for m in self.native) if t is not None), None)
