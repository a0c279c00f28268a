"""F32 weights, F32 activations (``matmul_clamp_f32_f32p_f32p``): the SME2 MOPA GEMM llama.cpp runs F32 weights
through at prefill on SME2 (its GEMV at decode is the SME2 MLA kernel of ``f32_f32p``, on the same packed weights).

``ukernels`` holds the LHS packer and the kernel (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``sme2`` the native SME2 tile, ``isa`` the instruction program the emulator
runs and ``node`` the compiled plan's routines. The RHS packer, the layout's arithmetic and the adaptor from GGML F32
tensors are shared with the GEMV: :mod:`kleidipy.kernels.pack.f32p`.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.f32p_f32p import isa, node, sme2, ukernels
from kleidipy.kernels.pack import f32p

FAMILY = declare(ukernels, isa, f32p, (GGMLType.F32,), native=(sme2,), node=node)
