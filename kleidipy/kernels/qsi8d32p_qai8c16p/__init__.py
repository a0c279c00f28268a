"""Exact-weight family: int8 weight codes with an f32 scale and offset per 16 values, int8 activations per 32-block
(``matmul_clamp_f32_qsi8d32p_qai8c16p``), kleidipy's own (KleidiAI has no kernel for these weights): the GGML types
whose values are ``scale·code + offset`` per 16 (:mod:`kleidipy.formats.codes16`), multiplied exactly as the file
holds them.

``ukernels`` holds the packer and the GEMM/GEMV (KleidiAI-style names and getters, the numpy reference execution),
``jit`` their numba code, ``vnni`` the AVX-512 VNNI tile, ``neon`` the native aarch64 tiles (DotProd ``sdot``),
``isa`` the instruction programs the emulator runs, ``node`` the compiled plan's routines and ``ggml`` the adaptor
from weight bytes or floats to the RHS packer's inputs with the load-time exactness check.
"""

from kleidipy.formats import codes16
from kleidipy.kernels.declare import declare
from kleidipy.kernels.qsi8d32p_qai8c16p import ggml, isa, neon, node, ukernels

FAMILY = declare(ukernels, isa, ggml, codes16.TYPES, native=(neon,), node=node, exact_rows=True)
