"""KleidiAI micro-kernel families, one package each (as KleidiAI's ``kai/ukernels/matmul/<family>/``): its
packers and kernels, their jit/VNNI code, emulator programs and GGML adaptor, declared in one ``FAMILY`` record;
:mod:`kleidipy.kernels.catalogue` discovers the records and looks kernels and packers up by KleidiAI name."""
