"""F16 weights as BF16 (``matmul_clamp_f32_bf16p_bf16p``): llama.cpp's F16 route on SME2/SME (BFMOPA) and the
NEON BF16 MMLA/DOT kernels.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``isa`` the instruction programs the emulator runs and ``ggml`` the adaptor
from weight bytes or floats to the RHS packer's inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.bf16p_bf16p import ggml, isa, native, node, ukernels
from kleidipy.kernels.declare import declare

FAMILY = declare(ukernels, isa, ggml, (GGMLType.F16, GGMLType.F32), native=(native,), node=node)
