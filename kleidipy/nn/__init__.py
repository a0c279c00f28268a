"""Quantized layers for other frameworks: the runtime's repacked matmul behind a plain ``Linear`` interface.

:class:`QuantizedLinear` works on numpy arrays; :mod:`kleidipy.nn.torch` (extra ``[torch]``) wraps it as a
``torch.nn.Module`` and converts a model's ``nn.Linear`` layers.
"""

from kleidipy.nn.linear import WEIGHT_TYPES, QuantizedLinear

__all__ = ["WEIGHT_TYPES", "QuantizedLinear"]
