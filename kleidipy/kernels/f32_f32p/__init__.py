"""F16 weights as exact F32 (``matmul_clamp_f32_f32_f32p``): the NEON FMLA fallback; the weights take the
F16 family's route (its ``ggml`` adaptor, its ``jit`` module).

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``isa`` the instruction programs the emulator runs and ``ggml`` the adaptor from weight bytes or floats
to the RHS packer's inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.kernels.bf16p_bf16p import ggml
from kleidipy.kernels.declare import declare
from kleidipy.kernels.f32_f32p import isa, node, ukernels

FAMILY = declare(ukernels, isa, ggml, (GGMLType.F16, GGMLType.F32), node=node)
