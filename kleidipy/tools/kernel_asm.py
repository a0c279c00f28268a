"""``kleidipy kernels --asm NAME [--isa ISA]``: the hot loop of the machine code the jit runs for a kernel, with a
count per instruction and per 1,024 int8 MACs, beside the count of KleidiAI's own kernel for the same tile. Owns
where the code comes from per ISA.

Details: docs/hot-loops.md."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources

import numpy as np

from kleidipy.core import native
from kleidipy.core.matmul import MatmulKernel
from kleidipy.errors import KleidipyError
from kleidipy.tools.asm import LoopCount, hot_loop

#: the ISAs ``--isa`` takes
ISA_NAMES = ("x86-vnni", "aarch64-dotprod", "aarch64-i8mm", "aarch64-sme", "aarch64-sme2", "portable")
#: the ISAs of native tiles, poorest first
_ARM_ISAS = tuple(name for name in ISA_NAMES if name.startswith("aarch64-"))


class NoTileError(KleidipyError, ValueError):
    """A kernel has no code of its own for the ISA asked (or it cannot be compiled on this host)."""


@dataclass(frozen=True)
class Listing:
    """A kernel's hot loop on one ISA (``how``: where the code came from) and KleidiAI's count for the kernel."""

    kernel: MatmulKernel
    isa: str
    how: str
    loop: LoopCount
    kleidiai: dict | None


def kleidiai_counts() -> dict:
    """KleidiAI's hot-loop counts per kernel name (``kleidiai_commit`` and ``kernels``)."""
    return json.loads(resources.files("kleidipy.tools.data").joinpath("kleidiai_hot_loops.json").read_text())


def default_isa(kernel: MatmulKernel) -> str:
    """The ISA of the code the jit runs for ``kernel`` on this host: the richest Arm ISA of the host the kernel's
    family has a tile for, else x86-vnni."""
    from kleidipy.kernels.catalogue import family_of

    for name in _ARM_ISAS[::-1]:
        isa = native.host_isa(name)
        if isa is not None and family_of(kernel).native_tile(kernel, isa) is not None:
            return name
    return "x86-vnni"


def listing(kernel: MatmulKernel, isa: str, svl_bits: int = 512) -> Listing:
    """The hot loop of ``kernel`` on ``isa`` (NoTileError when it has no code of its own there)."""
    from kleidipy.kernels.catalogue import family_of

    if isa not in ISA_NAMES:
        raise NoTileError(f"unknown ISA {isa!r}: use one of {', '.join(ISA_NAMES)}")
    if isa == "x86-vnni":
        text, how = _vnni_assembly(kernel), "numba code compiled for this host (AVX-512 VNNI tiles)"
    elif isa == "portable":
        text = _portable_assembly(kernel, svl_bits)
        how = f"numba code compiled for a generic {platform.machine()} CPU (no VNNI tile, no native tile)"
    else:
        target = native.ISAS.get(isa)
        module = family_of(kernel).native_tile(kernel, target) if target else None
        if module is None:
            raise NoTileError(f"kai_{kernel.name}: no native {isa} tile (the jit runs numba code there)")
        text = native.assembly(module, target)
        how = f"native tile, cross-compiled ({target.triple}, {' '.join(target.features)})"
    portable = isa == "portable"
    loop = hot_loop(text, svl_bits, block_loops=isa not in ("x86-vnni", "portable"), portable=portable)
    if loop is None:
        what = "integer multiply" if portable else "int8 dot-product instruction"
        raise NoTileError(f"kai_{kernel.name}: no {what} in any loop of its {isa} code")
    return Listing(kernel, isa, how, loop, kleidiai_counts()["kernels"].get(kernel.name))


def _vnni_assembly(kernel: MatmulKernel) -> str:
    """Every kleidipy numba function the kernel's jit runs on this host whose assembly uses vpdpbusd."""
    from kleidipy.core.vnni import HAS_AVX512_VNNI

    if not HAS_AVX512_VNNI:
        raise NoTileError(
            "x86-vnni: the VNNI tiles are numba code, compiled for the host only: run on an x86 host with AVX-512 VNNI"
        )
    return "\n".join(t for t in jit_assembly(kernel) if "vpdpbusd" in t)


def _portable_assembly(kernel: MatmulKernel, svl_bits: int) -> str:
    """The assembly of every kleidipy numba function the kernel's jit runs on a generic CPU of this host's
    architecture (compiled in a subprocess: numba reads its target CPU at import)."""
    code = (
        "import sys\n"
        "from kleidipy.kernels.catalogue import get_kernel\n"
        "from kleidipy.tools.kernel_asm import jit_assembly\n"
        f"sys.stdout.write('\\n'.join(jit_assembly(get_kernel({kernel.name!r}, {svl_bits}))))\n"
    )
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES="")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise NoTileError(f"portable: compiling kai_{kernel.name} for a generic CPU failed: {last}")
    return done.stdout


def jit_assembly(kernel: MatmulKernel) -> list[str]:
    """The assembly of every kleidipy numba function compiled in this process once the kernel's jit has run on
    random operands, compiled afresh (no cache: numba keeps no assembly of cached code)."""
    from numba.core.caching import NullCache
    from numba.core.registry import CPUDispatcher

    from kleidipy.kernels.catalogue import family_of

    dispatchers = [
        obj
        for name, mod in list(sys.modules.items())
        if name.startswith("kleidipy.") and mod is not None
        for obj in vars(mod).values()
        if isinstance(obj, CPUDispatcher)
    ]
    for d in dispatchers:
        d._cache = NullCache()
    m = 1 if kernel.kind == "gemv" else max(kernel.m_step, 2)
    n, k = 2 * kernel.n_step, 256
    rng = np.random.default_rng(0)
    rhs_in, kw = family_of(kernel).from_float(rng.standard_normal((n, k)).astype(np.float32), kernel.rhs_packer)
    rhs = kernel.pack_rhs(n, k, rhs_in, execution="reference", **kw)
    lhs = kernel.pack_lhs(rng.standard_normal((m, k)).astype(np.float32), execution="reference")
    kernel.run(m, n, k, lhs, rhs, execution="jit")
    return [d.inspect_asm(sig) for d in dispatchers for sig in d.signatures]


def _kind(kernel: MatmulKernel) -> str:
    """What a kernel's MACs multiply: F16 (the F16-LHS family's widening FMOPA) or int8 (the others)."""
    return "F16" if kernel.lhs_packer is not None and "f16p" in kernel.lhs_packer.name else "int8"


def format_listing(found: Listing) -> str:
    """The listing as ``kleidipy kernels --asm`` prints it."""
    loop, kai = found.loop, found.kleidiai
    out = [
        f"kai_{found.kernel.name} on {found.isa}: {found.how}",
        f"hot loop: {loop.instructions} instructions, {loop.macs} {_kind(found.kernel)} MACs per iteration "
        + (f"({loop.dots} dot instructions)" if loop.dots else f"({loop.multiplies} integer multiplies)")
        + f" = {loop.per_1024_macs():.0f} instructions per 1,024 MACs",
    ]
    if kai:
        per = kai["instructions"] * 1024 / kai["macs_at_svl512"]
        out.append(
            f"KleidiAI's kernel ({kai['source']}): {kai['instructions']} instructions, {kai['macs_at_svl512']} MACs "
            f"= {per:.0f} per 1,024 MACs; ratio {loop.per_1024_macs() / per:.2f}"
        )
    else:
        out.append("KleidiAI's kernel: not counted (no hot loop with dot products in its sources' list)")
    if found.kernel.tier in ("sme", "sme2"):
        out.append(
            "(SME: a loop nested in the hot loop counts once as written — KleidiAI's K-group loop runs 8 times per "
            "block and its row loop VL/4 times, kleidipy's MOPA tile unrolls its K groups — so these per-1,024 "
            "figures do not compare; README's *Runs on* has the executed counts per block)"
        )
    out.append("")
    out += [line.text.rstrip() for line in loop.lines]
    out.append("")
    names = sorted(set(loop.counts) | set(kai["counts"] if kai else {}), key=lambda m: (-loop.counts.get(m, 0), m))
    out.append(f"{'instruction':<14} {'count':>6} {'per 1,024 MACs':>15}" + (f" {'KleidiAI':>9}" if kai else ""))
    for name in names:
        ours = loop.counts.get(name, 0)
        row = f"{name:<14} {ours:>6} {loop.per_1024_macs(ours):>15.1f}"
        if kai:
            row += f" {kai['counts'].get(name, 0) * 1024 / kai['macs_at_svl512']:>9.1f}"
        out.append(row)
    return "\n".join(out)
