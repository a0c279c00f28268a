"""Q4_0 weights, int8 activations per 32-block (``matmul_clamp_f32_qsi8d32p_qsi4c32p``): llama.cpp's Q4_0 route on
SME2 (MOPA GEMM, SDOT GEMV), SME, I8MM and DotProd.

``ukernels`` holds the LHS packers and the kernels (KleidiAI's names, getters and argument orders; the numpy
reference execution), ``jit`` their numba code, ``vnni`` the AVX-512 VNNI tiles of the SME/SME2 layouts
(``vnni_neon``: of the NEON layout), ``neon`` and ``sme2`` the native aarch64 tiles of the NEON and SME2 kernels and
``isa`` the instruction programs the emulator runs. The RHS packers and the adaptor from GGML bytes are shared with
the F16-LHS family: :mod:`kleidipy.kernels.pack`.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.pack import q4_0
from kleidipy.kernels.qsi8d32p_qsi4c32p import isa, neon, node, sme, sme2, ukernels

FAMILY = declare(ukernels, isa, q4_0, (GGMLType.Q4_0,), native=(neon, sme2, sme), node=node, exact_rows=True)
