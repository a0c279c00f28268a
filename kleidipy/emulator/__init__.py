"""kleidipy's third execution of the matmul kernels: an instruction-level emulator ("isa").

A *program* replays one KleidiAI kernel's loops and its SME/SME2/SVE or NEON instructions over the real packed
bytes, on an emulated register file (:mod:`.machine`, instructions in :mod:`.sme` and :mod:`.neon`, shared
tiles in :mod:`.common`). The programs live with their families (``kleidipy/kernels/<family>/isa.py``), which
hand them to :func:`isa_execution` to become their kernels' ``isa`` execution. Results are bit-exact with the
golden data; the machine counts instructions by mnemonic and bytes moved, and can log the first tile's first K
block step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kleidipy.emulator.machine import Buffer, Machine

#: A program: (machine, kernel, m, n, k, lhs, rhs, dst) -> None; it writes the unclamped result into dst.
Program = Callable[[Machine, Any, int, int, int, Buffer, Buffer, Buffer], None]


def isa_execution(program: Program) -> Callable[..., tuple[np.ndarray, Machine]]:
    """A kernel's ``isa`` execution from its program: ``(kernel, m, n, k, lhs, rhs, trace=False, record=False)`` ->
    (unclamped float32 [m, n], the machine with its counters, its trace log and, with ``record``, the registers each
    traced instruction changed)."""

    def run(
        kernel: Any, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, trace: bool = False, record: bool = False
    ) -> tuple[np.ndarray, Machine]:
        machine = Machine(kernel.svl_bits if kernel.is_sme else None, trace=trace or record, record=record)
        lhs_buf = Buffer("lhs", np.ascontiguousarray(lhs).reshape(-1).view(np.uint8))
        rhs_buf = Buffer("rhs", np.ascontiguousarray(rhs).reshape(-1).view(np.uint8))
        dst = Buffer("dst", np.zeros(m * n * 4, dtype=np.uint8))
        program(machine, kernel, m, n, k, lhs_buf, rhs_buf, dst)
        return dst.data.view("<f4").reshape(m, n), machine

    run.program = program  # type: ignore[attr-defined]
    return run


def attach_programs(kernels: Any, programs: dict[str, Program]) -> None:
    """Give each kernel that has a program its ``isa`` execution (a family does this for its kernels)."""
    for kernel in kernels:
        if kernel.name in programs:
            kernel.isa = isa_execution(programs[kernel.name])
