"""The transformer's ops as compiled kernels with one fixed order of operations (ggml-cpu's, as it runs on Arm):
norms, activations, RoPE and the KV-cache cells (``elementwise``), the KV cache's layout and the attention over it
(``attention``). Both executions call them -- the eager path (:mod:`kleidipy.runtime.layers`) from Python, the
compiled plan (:mod:`kleidipy.graph`) from numba code -- so ``ops`` sits below both and imports neither."""
