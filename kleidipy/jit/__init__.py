"""Numba / llvmlite code the kernels call for speed; each function matches a numpy reference bit for bit."""
