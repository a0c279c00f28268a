"""The catalogue: every matmul kernel and packer kleidipy implements, keyed by its KleidiAI name.

Each family package ``kleidipy/kernels/<family>/`` declares one :class:`~kleidipy.core.family.Family` record
(``FAMILY``); they are discovered here, so adding a family is adding a folder. A name in
KleidiAI's early spelling (``kai_run_matmul_clip_f32_qa8dxP4X8_...``) finds the entry it denotes today.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from functools import cache

import kleidipy.kernels as _pkg
from kleidipy.core.family import Family
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.names import current_name
from kleidipy.core.packers import Packer
from kleidipy.errors import UnknownKernelError


@cache
def families() -> tuple[Family, ...]:
    """Every family package's record, in name order."""
    found = []
    for info in sorted(pkgutil.iter_modules(_pkg.__path__), key=lambda i: i.name):
        if info.ispkg and not info.name.startswith("_") and info.name != "pack":  # (pack: the shared room)
            found.append(importlib.import_module(f"{_pkg.__name__}.{info.name}").FAMILY)
    return tuple(found)


def family_of(kernel: MatmulKernel) -> Family:
    """The family a kernel belongs to."""
    return next(f for f in families() if f.name == kernel.family)


def family_of_packer(packer: Packer) -> Family:
    """The (first) family that declares a packer (the Q8_0 family's LHS packer serves two)."""
    return next(f for f in families() if any(p.name == packer.name for p in f.packers))


def _strip(name: str) -> str:
    """Canonical key: the KleidiAI name in today's spelling without ``kai_run_`` / ``kai_`` and without a
    golden ``__rhs_*`` suffix."""
    return current_name(name.split("__")[0]).removeprefix("kai_")


@cache
def _kernels() -> dict[str, MatmulKernel]:
    return {kern.name: kern for fam in families() for kern in fam.kernels}


@cache
def _packers() -> dict[str, Packer]:
    return {p.name: p for fam in families() for p in fam.packers}


def all_kernels() -> list[MatmulKernel]:
    """Every matmul kernel (SME kernels unbound: call ``.bind(svl)``)."""
    return list(_kernels().values())


def all_packers() -> list[Packer]:
    return list(_packers().values())


def _unknown(kind: str, name: str, choices: list[str]) -> UnknownKernelError:
    close = difflib.get_close_matches(_strip(name), choices, n=1, cutoff=0.5)
    hint = f"; did you mean kai_{close[0]}?" if close else "; `kleidipy kernels` lists them"
    return UnknownKernelError(f"unknown {kind} '{name}'{hint}")


def get_kernel(name: str, svl_bits: int | None = None) -> MatmulKernel:
    """The kernel called ``name`` (with or without ``kai_``/``kai_run_``), bound to ``svl_bits`` if SME."""
    kernels = _kernels()
    key = _strip(name)
    if key not in kernels:
        raise _unknown("kernel", name, list(kernels))
    return kernels[key].bind(svl_bits)


def get_packer(name: str) -> Packer:
    packers = _packers()
    key = _strip(name)
    if key not in packers:
        raise _unknown("packer", name, list(packers))
    return packers[key]
