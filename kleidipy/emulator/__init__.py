"""kleidipy's third execution of the matmul kernels: an instruction-level emulator ("isa").

Each covered KleidiAI kernel has a *program* (one module per family) that replays the kernel's loops and its
SME/SME2/SVE or NEON instructions over the real packed bytes, on an emulated register file (:mod:`.machine`,
instructions in :mod:`.sme` and :mod:`.neon`). Results are bit-exact with the golden data; the machine counts
instructions by mnemonic and bytes moved, and can log the first tile's first K block step by step.

Entry points: :func:`emulate_kernel` (what ``MatmulKernel.run(execution="isa")`` calls), :func:`emulate`
(result and machine) and :func:`emulate_report` (random inputs, packing, emulation, a bit-exactness check
against the jit execution, counts table and trace — the ``kleidipy emulate`` command).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kleidipy.core.buffers import check_svl
from kleidipy.core.catalogue import all_kernels, get_kernel
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.numerics import FLT_MAX, clamp_f32
from kleidipy.emulator import (
    bf16p_bf16p,
    f32_f32p,
    qai8dxp_qsi4cxp,
    qai8dxp_qsi8cxp,
    qsi8d32p_qai4c32p,
    qsi8d32p_qsi4c32p,
)
from kleidipy.emulator.machine import Buffer, Machine

#: A program: (machine, kernel, m, n, k, lhs, rhs, dst) -> None; it writes the unclamped result into dst.
Program = Callable[[Machine, MatmulKernel, int, int, int, Buffer, Buffer, Buffer], None]

_FAMILIES = (qsi8d32p_qsi4c32p, qai8dxp_qsi8cxp, qai8dxp_qsi4cxp, qsi8d32p_qai4c32p, bf16p_bf16p, f32_f32p)

#: kernel name (without ``kai_``) -> its program.
PROGRAMS: dict[str, Program] = {name: prog for mod in _FAMILIES for name, prog in mod.PROGRAMS.items()}


def covered(kernel: MatmulKernel) -> bool:
    """Whether the emulator has a program for this kernel."""
    return kernel.name in PROGRAMS


def emulate(
    kernel: MatmulKernel, m: int, n: int, k: int, lhs: np.ndarray, rhs: np.ndarray, trace: bool = False
) -> tuple[np.ndarray, Machine]:
    """Run ``kernel``'s program on packed buffers (flat uint8; a plain float32 LHS for the f32 kernel).

    Returns the unclamped float32 [m, n] result and the machine (counters, trace log)."""
    program = PROGRAMS.get(kernel.name)
    if program is None:
        raise NotImplementedError(f"the isa emulator has no program for kernel {kernel.kai_name}")
    machine = Machine(kernel.svl_bits if kernel.is_sme else None, trace=trace)
    lhs_buf = Buffer("lhs", np.ascontiguousarray(lhs).reshape(-1).view(np.uint8))
    rhs_buf = Buffer("rhs", np.ascontiguousarray(rhs).reshape(-1).view(np.uint8))
    dst = Buffer("dst", np.zeros(m * n * 4, dtype=np.uint8))
    program(machine, kernel, m, n, k, lhs_buf, rhs_buf, dst)
    return dst.data.view("<f4").reshape(m, n), machine


def emulate_kernel(kernel: MatmulKernel, m: int, n: int, k: int, lhs_u8: np.ndarray, rhs_u8: np.ndarray) -> np.ndarray:
    """The ``isa`` execution of a kernel: unclamped float32 [m, n] (NotImplementedError if not covered)."""
    return emulate(kernel, m, n, k, lhs_u8, rhs_u8)[0]


def random_operands(kernel: MatmulKernel, m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Packed (LHS, RHS) buffers for a kernel call on random data: an f32 LHS [m, k] (standard normal) and
    weights N(0, 0.5²) [n, k] in the family's format (Q4_0, per-channel int4, Q8_0 re-quantized, Q4_1, F16),
    packed with the kernel's packers (the f32 kernel's LHS is the float rows)."""
    family = next((mod for mod in _FAMILIES if kernel.name in mod.PROGRAMS), None)
    if family is None:
        raise NotImplementedError(f"the isa emulator has no program for kernel {kernel.kai_name}")
    rng = np.random.default_rng(seed)
    lhs_f32 = rng.standard_normal((m, k)).astype(np.float32)
    weights = rng.normal(0.0, 0.5, (n, k)).astype(np.float32)
    rhs_in, rhs_kw = family.rhs_inputs(kernel, weights)
    rhs_packed = np.asarray(kernel.pack_rhs(n, k, rhs_in, **rhs_kw))
    return np.asarray(kernel.pack_lhs(lhs_f32, m, k)), rhs_packed


def emulate_report(kernel_name: str, m: int, n: int, k: int, svl_bits: int, trace: bool, seed: int = 0) -> str:
    """Emulate one kernel call on random inputs (:func:`random_operands`) and describe it.

    Runs the emulator, checks the result against the jit execution bit for bit, and returns the
    instruction-count table (plus the trace of the first K block of the first tile when ``trace``).
    Raises UnknownKernelError for an unknown name, KernelShapeError for a bad SVL or shape."""
    check_svl(svl_bits)
    kern = get_kernel(kernel_name, svl_bits)
    kern.check_args(m, n, k)
    lhs_packed, rhs_packed = random_operands(kern, m, n, k, seed)
    result, machine = emulate(kern, m, n, k, lhs_packed, rhs_packed, trace=trace)
    jit = kern.run(m, n, k, lhs_packed, rhs_packed, execution="jit")
    ours = clamp_f32(result, -FLT_MAX, FLT_MAX)
    differ = int(np.count_nonzero(ours.view(np.uint32) != jit.view(np.uint32)))
    svl = f", SVL {svl_bits} bits" if kern.is_sme else ""
    exact = "yes" if differ == 0 else f"NO ({differ} of {m * n} outputs differ)"
    lines = [
        f"{kern.kai_name}  m={m} n={n} k={k}{svl}  ({kern.tier} {kern.kind}, seed {seed})",
        f"m_step={kern.m_step} n_step={kern.n_step} mr={kern.mr} nr={kern.nr} kr={kern.kr} sr={kern.sr}",
        f"bit-exact with the jit execution: {exact}",
        "",
        machine.counts_table(),
    ]
    if trace:
        lines += ["", "trace (first K block of the first tile):", *machine.log]
    return "\n".join(lines)


def uncovered_kernels() -> list[str]:
    """Catalogue kernels the emulator has no program for."""
    return [kern.name for kern in all_kernels() if not covered(kern)]
