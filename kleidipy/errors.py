"""Typed exceptions: every bad input the library rejects raises one of these, with a one-line message."""


class KleidipyError(Exception):
    """Base of every error kleidipy raises on purpose (the CLI prints it as one line)."""


class KernelShapeError(KleidipyError, ValueError):
    """A shape a kernel or packer cannot take (k not a multiple of bl, m > 1 on a GEMV kernel, ...)."""


class BufferSizeError(KleidipyError, ValueError):
    """A buffer too small (or of the wrong size) for the shape it is used with."""


class DTypeError(KleidipyError, TypeError):
    """An array of the wrong dtype."""


class NonFiniteInputError(KleidipyError, ValueError):
    """NaN or Inf where the kernels need finite numbers (activations, weights, scales, zero points, biases)."""


class PackedLayoutMismatchError(KleidipyError, ValueError):
    """A packed buffer made by another packer, or with other parameters (nr, kr, SVL), than the kernel needs."""


class InvalidTokenError(KleidipyError, ValueError):
    """Token ids that are not a 1-D integer sequence within the vocabulary."""


class InvalidArgumentError(KleidipyError, ValueError):
    """An option outside its range or choices: execution, thread count, seed, port, context size..."""


class UnknownKernelError(KleidipyError, KeyError):
    """A kernel or packer name that is not in the catalogue."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TargetError(KleidipyError, ValueError):
    """A target specification that cannot be parsed or selects nothing."""


class UnsupportedTensorTypeError(KleidipyError, ValueError):
    """A GGML tensor type kleidipy cannot quantize or dequantize."""


class WeightsNotExactError(KleidipyError, ValueError):
    """Packed weights that do not read back as the model file's values (the load-time exactness check)."""


class GoldenDataError(KleidipyError):
    """A golden manifest or file that cannot be read or run."""
