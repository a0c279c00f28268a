"""What a layout picture shows: the label maps of a kernel's buffers (panels) at one shape, and its error type."""

from __future__ import annotations

from dataclasses import dataclass

from kleidipy.core.matmul import MatmulKernel
from kleidipy.errors import KleidipyError
from kleidipy.tools.layout.probe import BufferMap


class LayoutError(KleidipyError, ValueError):
    """A layout picture that cannot be made: unknown output extension, unwritable path, shape too large."""


@dataclass(frozen=True)
class Panel:
    """One buffer of the picture: what it is (``title``, ``detail``) and its label map."""

    title: str
    detail: str
    map: BufferMap
    #: bytes of the layout's repeating unit (a tensor row, a packed group of rows), for wrapping the picture
    period: int


@dataclass(frozen=True)
class LayoutMaps:
    """The label maps of a kernel's buffers at one shape: RHS as given (if any), RHS packed, LHS packed (if any)."""

    kernel: MatmulKernel
    m: int
    n: int
    k: int
    rhs_source: Panel | None
    rhs: Panel
    lhs: Panel | None

    @property
    def panels(self) -> tuple[Panel, ...]:
        return tuple(p for p in (self.rhs_source, self.rhs, self.lhs) if p is not None)

    @property
    def heading(self) -> str:
        kern = self.kernel
        svl = f" at SVL {kern.svl_bits}" if kern.is_sme else ""
        return f"{kern.kai_name}{svl}: m={self.m}, n={self.n}, k={self.k}"

    @property
    def geometry(self) -> str:
        kern = self.kernel
        bl = "" if kern.bl is None else f", bl={kern.bl}"
        return f"mr={kern.mr}, nr={kern.nr}, kr={kern.kr}, sr={kern.sr}{bl} ({kern.tier} {kern.kind})"
