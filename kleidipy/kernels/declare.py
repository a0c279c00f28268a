"""How a family package declares itself: one call makes its :class:`~kleidipy.core.family.Family` record from its
modules (``ukernels``, ``isa``, the adaptor module) and gives its kernels their emulator programs."""

from __future__ import annotations

from types import ModuleType

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.family import Family
from kleidipy.emulator import attach_programs


def declare(
    ukernels: ModuleType,
    isa: ModuleType | None,
    adaptor: ModuleType,
    ggml_types: tuple[GGMLType, ...] = (),
    native: tuple[ModuleType, ...] = (),
    node: ModuleType | None = None,
    exact_rows: bool = False,
) -> Family:
    """The family of ``ukernels`` (its FAMILY_NAME, KERNELS and PACKERS), taking ``ggml_types`` through
    ``adaptor.from_ggml`` (none: no GGML type is the family's format) and floats through ``adaptor.from_float``;
    ``native`` its native-tile modules, ``node`` the module of its compiled plan routines; ``exact_rows``:
    :attr:`Family.exact_rows`; ``isa`` None: the emulator runs none of its kernels; ``ukernels.get_rows``, where
    defined, is the family's GET_ROWS from packed weights (:attr:`Family.get_rows`)."""
    family = Family(
        name=ukernels.FAMILY_NAME,
        kernels=tuple(ukernels.KERNELS),
        packers=tuple(ukernels.PACKERS),
        ggml_types=ggml_types,
        from_ggml=adaptor.from_ggml if ggml_types else None,
        from_float=adaptor.from_float,
        programs=isa.PROGRAMS if isa is not None else {},
        native=native,
        node=node.node if node is not None else None,
        exact_rows=exact_rows,
        get_rows=getattr(ukernels, "get_rows", None),
    )
    attach_programs(family.kernels, family.programs)
    return family
