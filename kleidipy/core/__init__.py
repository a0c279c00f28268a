"""The micro-kernel interface every KleidiAI family shares, and nothing else of kleidipy: packed buffers that
remember their layout (``buffers``), the packer and matmul-kernel bases with KleidiAI's getters and the prepared
matmul a runtime calls (``packers``, ``matmul``), the llama.cpp thread split (``threads``), exact float32
numerics in numpy and numba (``numerics``), the KleidiAI name decoder (``names``), the AVX-512 VNNI IR helpers
(``vnni``) and the record a family declares (``family``)."""
