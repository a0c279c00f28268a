"""F16 weights as BF16 (``matmul_clamp_f32_bf16p_bf16p``): llama.cpp's F16 route on SME2/SME (BFMOPA) and the
NEON BF16 MMLA/DOT kernels.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``native`` the native aarch64 tiles, ``isa`` the instruction programs the
emulator runs and ``node`` the compiled plan's routines; the weights come through the F16 route's shared adaptor
(:mod:`kleidipy.kernels.pack.kxn`).
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.bf16p_bf16p import isa, native, node, ukernels
from kleidipy.kernels.declare import declare
from kleidipy.kernels.pack import kxn

FAMILY = declare(ukernels, isa, kxn, (GGMLType.F16, GGMLType.F32), native=(native,), node=node)
