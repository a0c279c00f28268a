"""Q8_0 weights requantized per output channel, int8 activations per row
(``matmul_clamp_f32_qai8dxp_qsi8cxp``): llama.cpp's Q8_0 route on SME2, SME, I8MM and DotProd.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``vnni`` the AVX-512 VNNI tiles (SME/SME2 and NEON layouts), ``neon`` and
``sme2`` the native aarch64 tiles of the NEON and SME2 kernels, ``isa`` the instruction programs the emulator runs
and ``ggml`` the adaptor from weight bytes or floats to the RHS packer's inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.declare import declare
from kleidipy.kernels.qai8dxp_qsi8cxp import ggml, isa, neon, node, sme, sme2, ukernels

FAMILY = declare(ukernels, isa, ggml, (GGMLType.Q8_0,), native=(neon, sme2, sme), node=node, exact_rows=True)
