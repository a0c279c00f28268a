"""PyTorch integration (extra ``[torch]``): :class:`KleidiLinear`, an ``nn.Linear`` with a GGML-quantized weight.

The matmul runs as the custom op ``torch.ops.kleidipy.quantized_linear`` (registered with ``torch.library``,
with a fake implementation so ``torch.compile`` traces through it), which calls the layer's
:class:`~kleidipy.nn.QuantizedLinear` — the same bits as the numpy layer and the runtime. Inference only:
float32 CPU tensors, no autograd. :func:`convert` swaps the ``nn.Linear`` layers of a model in place.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

from gguf import GGMLQuantizationType as GGMLType

try:
    import torch
    from torch import nn
except ImportError as e:  # torch is the optional extra [torch]
    raise ImportError("kleidipy.nn.torch needs PyTorch: pip install 'kleidipy[torch]'") from e

from kleidipy.errors import DTypeError, InvalidArgumentError, KleidipyError
from kleidipy.nn.linear import QuantizedLinear
from kleidipy.target import Target, resolve_target

#: the op reaches its layer through a number (an op's arguments are tensors and scalars, not Python objects)
_LAYERS: weakref.WeakValueDictionary[int, QuantizedLinear] = weakref.WeakValueDictionary()
_IDS = itertools.count()


@torch.library.custom_op("kleidipy::quantized_linear", mutates_args=())
def quantized_linear(x: torch.Tensor, layer: int, out_features: int) -> torch.Tensor:
    """``x [..., in_features]`` float32 through the registered QuantizedLinear number ``layer``."""
    return torch.from_numpy(_LAYERS[layer](x.numpy()))


@quantized_linear.register_fake
def _(x: torch.Tensor, layer: int, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class KleidiLinear(nn.Module):
    """A drop-in for ``nn.Linear`` (inference): ``y = x Wᵀ + b`` with W quantized to Q4_0, Q8_0 or Q4_1."""

    def __init__(self, layer: QuantizedLinear):
        super().__init__()
        self.layer = layer
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self._register()

    def _register(self) -> None:
        self.layer_id = next(_IDS)
        _LAYERS[self.layer_id] = self.layer

    def __setstate__(self, state: dict) -> None:  # copy.deepcopy: the copy's own layer gets its own number
        super().__setstate__(state)
        self._register()

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        weight_type: GGMLType | int | str = "q4_0",
        *,
        target: Target | str | None = None,
        threads: int = 1,
        name: str = "linear",
    ) -> KleidiLinear:
        """The layer of ``linear``'s weight (and bias), quantized to ``weight_type`` by GGML's reference rules."""
        weight = linear.weight.detach().to("cpu", torch.float32).numpy()
        bias = None if linear.bias is None else linear.bias.detach().to("cpu", torch.float32).numpy()
        return cls(QuantizedLinear.from_float(weight, weight_type, bias, target=target, threads=threads, name=name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise DTypeError(f"KleidiLinear: input must be float32, got {x.dtype}")
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"KleidiLinear: input must be on the CPU, got {x.device}")
        return quantized_linear(x, self.layer_id, self.out_features)

    def extra_repr(self) -> str:
        layer = self.layer
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={layer.bias is not None}, "
            f"weight_type={layer.weight_type.name}, target={layer.target.name}"
        )


def convert(
    model: nn.Module,
    weight_type: GGMLType | int | str = "q4_0",
    *,
    target: Target | str | None = None,
    threads: int = 1,
    include: Callable[[str, nn.Linear], bool] | None = None,
) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (those ``include(name, layer)`` accepts) by a
    :class:`KleidiLinear` with its weight quantized to ``weight_type``; returns ``model``, changed in place
    (or the new layer, when ``model`` is itself an ``nn.Linear``).

    Subclasses of ``nn.Linear`` are left alone (their owners may read ``.weight``, as ``nn.MultiheadAttention``
    does). A layer the kernels cannot take (``in_features`` not a multiple of 32) raises, naming the layer.
    """
    tgt = target if isinstance(target, Target) else resolve_target(target)
    swaps = [
        (name, child)
        for name, child in model.named_modules()
        if type(child) is nn.Linear and (include is None or include(name, child))
    ]
    for name, child in swaps:
        try:
            layer = KleidiLinear.from_linear(child, weight_type, target=tgt, threads=threads, name=name)
        except KleidipyError as e:
            raise type(e)(f"{name}: {e}") from e
        if not name:
            return layer
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, layer)
    return model
