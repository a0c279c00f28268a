"""F16 weights as BF16 (``matmul_clamp_f32_bf16p_bf16p``): llama.cpp's F16 route on SME2/SME (BFMOPA) and the
NEON BF16 MMLA/DOT kernels.

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``jit`` their numba code, ``isa`` the instruction programs the emulator runs and ``ggml`` the adaptor
from weight bytes or floats to the RHS packer's inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.family import Family
from kleidipy.emulator import attach_programs
from kleidipy.kernels.bf16p_bf16p import ggml, isa, ukernels

FAMILY = Family(
    name=ukernels.FAMILY_NAME,
    kernels=tuple(ukernels.KERNELS),
    packers=tuple(ukernels.PACKERS),
    ggml_types=(GGMLType.F16, GGMLType.F32),
    from_ggml=ggml.from_ggml,
    from_float=ggml.from_float,
    programs=isa.PROGRAMS,
)
attach_programs(FAMILY.kernels, FAMILY.programs)
