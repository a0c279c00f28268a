"""KleidiAI micro-kernel families: one module per family (its packers and matmul kernels), the shared
interface (``interface``), the catalogue keyed by KleidiAI name (``catalogue``) and the name decoder (``names``)."""
