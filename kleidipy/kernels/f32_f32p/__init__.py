"""F16 weights as exact F32 (``matmul_clamp_f32_f32_f32p``): the NEON FMLA fallback; the weights take the
F16 family's route (its ``ggml`` adaptor, its ``jit`` module).

``ukernels`` holds the packers and kernels (KleidiAI's names, getters and argument orders; the numpy reference
execution), ``isa`` the instruction programs the emulator runs and ``ggml`` the adaptor from weight bytes or floats
to the RHS packer's inputs.
"""

from gguf import GGMLQuantizationType as GGMLType

from kleidipy.core.family import Family
from kleidipy.emulator import attach_programs
from kleidipy.kernels.bf16p_bf16p import ggml
from kleidipy.kernels.f32_f32p import isa, ukernels

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
