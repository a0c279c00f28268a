"""Per-channel int4 weights, int8 activations per row (``matmul_clamp_f32_qai8dxp_qsi4cxp``, KleidiAI's own
format, no GGML type): SME2, I8MM and DotProd; the LHS packer and portable jit are the Q8_0 family's.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``isa`` the instruction programs the emulator runs, ``ggml`` the adaptor from weight bytes or floats
to the RHS packer's inputs, and ``neon``, ``sme2``, ``vnni`` the family's native tiles.
"""

from kleidipy.kernels.declare import declare
from kleidipy.kernels.qai8dxp_qsi4cxp import ggml, isa, neon, sme2, ukernels

FAMILY = declare(ukernels, isa, ggml, native=(neon, sme2), exact_rows=True)
