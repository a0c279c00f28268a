"""Q4_0 weights, F16 activations (``matmul_clamp_f32_f16p_qsi4c32p``): the SME2 MOPA GEMM llama.cpp runs at
prefill for Q4_0 on SME2 (its GEMV at decode is the int8 SDOT kernel of ``qsi8d32p_qsi4c32p``, on the same packed
weights).

``ukernels`` holds the LHS packer and the kernel (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``sme2`` the native SME2 tile, ``isa`` the instruction program the emulator
runs and ``node`` the compiled plan's routines. The RHS packer and the adaptor from GGML bytes are shared with the
int8 Q4_0 family: :mod:`kleidipy.kernels.pack`.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.f16p_qsi4c32p import isa, node, sme2, ukernels
from kleidipy.kernels.pack import q4_0

FAMILY = declare(ukernels, isa, q4_0, (GGMLType.Q4_0,), native=(sme2,), node=node)
