"""``kleidipy emulate``: one kernel call on random inputs through its instruction program, checked against the
jit execution bit for bit, with the instruction counts and (optionally) the trace of the first K block."""

from __future__ import annotations

from typing import Any

import numpy as np

from kleidipy.core.buffers import check_svl
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.numerics import FLT_MAX, clamp_f32
from kleidipy.emulator.machine import Machine
from kleidipy.errors import KernelShapeError
from kleidipy.kernels.catalogue import all_kernels, family_of, get_kernel
from kleidipy.runtime.sampler import check_seed

#: The largest problem ``emulate_report`` takes: m·n·k (the emulator runs 10-30 million MACs a second) and
#: (m + n)·k input values.
MAX_REPORT_MACS = 1 << 28
MAX_REPORT_VALUES = 1 << 26


def random_operands(kernel: MatmulKernel, m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Packed (LHS, RHS) buffers for a kernel call on random data: an f32 LHS [m, k] (standard normal) and
    weights N(0, 0.5²) [n, k] in the family's format (its ``from_float``), packed with the kernel's packers
    (the f32 kernel's LHS is the float rows)."""
    rng = np.random.default_rng(seed)
    lhs_f32 = rng.standard_normal((m, k)).astype(np.float32)
    weights = rng.normal(0.0, 0.5, (n, k)).astype(np.float32)
    rhs_in, rhs_kw = family_of(kernel).from_float(weights, kernel.rhs_packer)
    rhs_packed = np.asarray(kernel.pack_rhs(n, k, rhs_in, **rhs_kw))
    return np.asarray(kernel.pack_lhs(lhs_f32, m, k)), rhs_packed


def emulate(
    kernel_name: str, m: int, n: int, k: int, svl_bits: int, trace: bool, seed: int = 0, record: bool = False
) -> tuple[MatmulKernel, Machine, int]:
    """Emulate one kernel call on random inputs (:func:`random_operands`): (the kernel, the machine — its counters,
    its trace of the first K block of the first tile when ``trace``, the registers each traced instruction changed
    when ``record`` —, the outputs that differ from the jit execution's, bit for bit).
    Raises UnknownKernelError for an unknown name, KernelShapeError for a bad SVL or shape (or one above
    MAX_REPORT_MACS); any integer seeds the inputs."""
    check_svl(svl_bits)
    kern = get_kernel(kernel_name, svl_bits)
    kern.check_args(m, n, k)
    if m * n * k > MAX_REPORT_MACS or (m + n) * k > MAX_REPORT_VALUES:
        raise KernelShapeError(
            f"m={m}, n={n}, k={k} is too large to emulate (m·n·k at most {MAX_REPORT_MACS}, (m + n)·k at most "
            f"{MAX_REPORT_VALUES}): use a smaller --shape"
        )
    if kern.isa is None:
        raise NotImplementedError(f"the isa emulator has no program for kernel {kern.kai_name}")
    lhs_packed, rhs_packed = random_operands(kern, m, n, k, check_seed(seed))
    result, machine = kern.isa(kern, m, n, k, lhs_packed, rhs_packed, trace=trace, record=record)
    jit = kern.run(m, n, k, lhs_packed, rhs_packed, execution="jit")
    ours = clamp_f32(result, -FLT_MAX, FLT_MAX)
    return kern, machine, int(np.count_nonzero(ours.view(np.uint32) != jit.view(np.uint32)))


def emulate_report(kernel_name: str, m: int, n: int, k: int, svl_bits: int, trace: bool, seed: int = 0) -> str:
    """``kleidipy emulate``: :func:`emulate`'s call described — the instruction-count table (plus the trace of the
    first K block of the first tile when ``trace``), and whether it is bit-exact with the jit execution."""
    kern, machine, differ = emulate(kernel_name, m, n, k, svl_bits, trace, seed)
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


def emulate_steps(kernel_name: str, m: int, n: int, k: int, svl_bits: int, seed: int = 0) -> dict[str, Any]:
    """:func:`emulate`'s call step by step, as the Inside view plays it: per line of ``kleidipy emulate --trace``'s
    trace, the Z registers and ZA rows the instruction changed (bytes as hex; ZA row r of tile ZAt.S is row 4r + t)."""
    kern, machine, differ = emulate(kernel_name, m, n, k, svl_bits, True, seed, record=True)
    return {
        "kernel": kern.kai_name,
        "m": m,
        "n": n,
        "k": k,
        "svl": svl_bits if kern.is_sme else None,
        "vector_bytes": machine.vb,
        "kind": kern.kind,
        "bit_exact": differ == 0,
        "counts": dict(machine.counts),
        "steps": [{"text": text, **change} for text, change in zip(machine.log, machine.steps or (), strict=True)],
    }


def uncovered_kernels() -> list[str]:
    """Catalogue kernels the emulator has no program for."""
    return [kern.name for kern in all_kernels() if kern.isa is None]
