"""Plain f32 LHS rows × packed f32 weights (``matmul_clamp_f32_f32_f32p``): the NEON FMLA fallback of the F16 route
and the SME2 MLA GEMV of llama.cpp's F32 route.

``ukernels`` holds the NEON RHS packer and the kernels (KleidiAI's names, getters and argument orders; the numpy
reference execution), ``sme2`` the SME2 GEMV's native tile, ``isa`` the instruction programs the emulator runs and
``node`` the compiled plan's routines; the SME2 GEMV's packer, the layout's numba code and the F32 route's adaptor are
shared with its MOPA GEMM (:mod:`kleidipy.kernels.pack.f32p`); F16 weights come through the F16 route's adaptor
(:mod:`kleidipy.kernels.pack.kxn`).
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.f32_f32p import isa, node, sme2, ukernels
from kleidipy.kernels.pack import kxn

FAMILY = declare(ukernels, isa, kxn, (GGMLType.F16, GGMLType.F32), native=(sme2,), node=node)
