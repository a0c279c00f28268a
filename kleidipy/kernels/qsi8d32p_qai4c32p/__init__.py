"""Q4_1 weights (per-block f32 scale and offset), int8 activations per 32-block
(``matmul_clamp_f32_qsi8d32p_qai4c32p``): SME2 (MOPA, DOT), I8MM and DotProd.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``vnni`` the AVX-512 VNNI tiles (both layouts), ``vnni_pack`` the vectorised
LHS packer, ``neon`` and ``sme2`` the native aarch64 tiles of the NEON and SME2 kernels, ``isa`` the instruction
programs the emulator runs and ``ggml`` the adaptor from weight bytes or floats to the RHS packer's inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.qsi8d32p_qai4c32p import ggml, isa, neon, node, sme2, ukernels

FAMILY = declare(ukernels, isa, ggml, (GGMLType.Q4_1,), native=(neon, sme2), node=node, exact_rows=True)
