"""F16 weights as exact F32 (``matmul_clamp_f32_f32_f32p``): the NEON FMLA fallback.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``isa`` the instruction programs the emulator runs and ``node`` the compiled
plan's routines; the weights come through the F16 route's shared adaptor (:mod:`kleidipy.kernels.pack.kxn`).
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.f32_f32p import isa, node, ukernels
from kleidipy.kernels.pack import kxn

FAMILY = declare(ukernels, isa, kxn, (GGMLType.F16, GGMLType.F32), node=node)
