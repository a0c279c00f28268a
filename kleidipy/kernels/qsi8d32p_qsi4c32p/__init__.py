"""Q4_0 weights, int8 activations per 32-block (``matmul_clamp_f32_qsi8d32p_qsi4c32p``): llama.cpp's Q4_0 route on
SME2 (MOPA GEMM, SDOT GEMV), SME, I8MM and DotProd.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``vnni`` the AVX-512 VNNI tiles of the SME/SME2 layouts (``vnni_neon``: of the
NEON layout), ``neon`` and ``sme2`` the native aarch64 tiles of the NEON and SME2 kernels, ``isa`` the
instruction programs the emulator runs and ``ggml`` the adaptor from weight bytes or floats to the RHS packer's
inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.qsi8d32p_qsi4c32p import ggml, isa, neon, node, sme, sme2, ukernels

FAMILY = declare(ukernels, isa, ggml, (GGMLType.Q4_0,), native=(neon, sme2, sme), node=node, exact_rows=True)
