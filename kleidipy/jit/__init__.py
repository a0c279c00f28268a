"""Numba / llvmlite code the kernels call for speed; every function here has a numpy reference it matches bit for bit."""
