"""kleidipy.nn: the numpy QuantizedLinear (the runtime's repacked matmul, bit for bit) and the PyTorch layer.

Float comparisons use a bound derived from the formats, not a fitted tolerance (see :func:`q4_0_bound`).
The torch tests need the optional extra: ``pip install -e ".[dev,torch]"`` then ``python -m pytest -m torch`` (the
default run, on the default install, leaves them out).
"""

import copy
from unittest import mock

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf_writer import write_gguf

from kleidipy import formats
from kleidipy.core import matmul
from kleidipy.errors import (
    BufferSizeError,
    DTypeError,
    InvalidArgumentError,
    KernelShapeError,
    NonFiniteInputError,
    TargetError,
    UnsupportedTensorTypeError,
)
from kleidipy.nn import QuantizedLinear
from kleidipy.runtime.backend import KleidiBackend
from kleidipy.runtime.gguf_file import GGUFContainer
from kleidipy.target import parse_target

TARGETS = ["sme2:svl=512", "i8mm", "dotprod"]
TYPES = [T.Q4_0, T.Q8_0, T.Q4_1]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def q4_0_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Largest |y - x·wᵀ| of a Q4_0 layer, per output [m, n], from the two roundings the kernels make.

    Weight: a Q4_0 block has d = amax/8 (stored as f16, relative error ≤ 2⁻¹¹); a code is off by ≤ |d|/2, or by
    ≤ |d| where the largest positive value clips to code +7, so δw ≤ |d|·(1 + 8·2⁻¹¹) per element.
    Activations: 8-bit, per 32-block symmetric (qsi8d32, scale s = amax/127 as f16) or per row asymmetric
    (qai8dx, scale = range/255): each element is off by ≤ s/2 + 127·s·2⁻¹¹ < amax(row)/127 =: δx.
    So |Δy| ≤ Σₖ |x|·δw + δx·(|w| + δw); 1% on top covers the float32 sums of the kernels and of the bound.
    """
    n, k = w.shape
    d = np.abs(w.astype(np.float64)).reshape(n, k // 32, 32).max(-1) / 8
    dw = np.repeat(d * (1 + 8 * 2.0**-11), 32, axis=1)
    ax = np.abs(x.astype(np.float64))
    dx = ax.max(-1, keepdims=True) / 127
    return 1.01 * (ax @ dw.T + dx * (np.abs(w) + dw).sum(1))


def _exact(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return y if b is None else y + b


# --------------------------------------------------------------------------------------------- numpy layer


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_same_bits_as_the_runtime_kernels(spec, ggml_type):
    """The layer's packed weight and outputs are the bytes of the backend's RepackedLinear and of the selected
    kernels' own pack_lhs + run, for the GEMM (m > 1) and the GEMV (m == 1); the bias is a float32 add after."""
    rng = _rng(1)
    n, k = 96, 128
    w, b = _normal(rng, n, k), _normal(rng, n)
    layer = QuantizedLinear.from_float(w, ggml_type.name, b, target=spec)
    ref = KleidiBackend(parse_target(spec))("w", ggml_type, (k, n), formats.quantize(w, ggml_type))
    assert layer.linear.packed.tobytes() == ref.packed.tobytes()
    assert layer.kernels == (ref.pair.gemm.name, ref.pair.gemv.name)
    x = _normal(rng, 2, 3, k)
    rows = x.reshape(6, k)
    assert layer(x).tobytes() == (ref(rows) + b).tobytes()
    for m in (1, 6):
        kern = ref.pair.for_m(m)
        out = kern.run(m, n, k, kern.pack_lhs(rows[:m], m, k), ref.packed)
        assert layer(rows[:m]).tobytes() == (out + b).tobytes(), kern.name


@pytest.mark.parametrize("spec", TARGETS)
def test_q4_0_within_its_bound_of_the_float_matmul(spec):
    rng = _rng(2)
    w, b = _normal(rng, 64, 256), _normal(rng, 64)
    layer = QuantizedLinear.from_float(w, "q4_0", b, target=spec)
    for x in (_normal(rng, 7, 256), 4 * _normal(rng, 1, 256)):
        err = np.abs(layer(x) - _exact(x, w, b))
        assert (err <= q4_0_bound(x, w)).all()


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_gguf_blocks_equal_floats_quantized_the_same_way(tmp_path, ggml_type):
    """Blocks read from a GGUF file (written by the gguf package's own quantizer) make the layer from_float makes."""
    rng = _rng(3)
    w, b = _normal(rng, 64, 96), _normal(rng, 64)
    path = write_gguf(tmp_path / "w.gguf", "llama", {}, {"w": w}, {"w": ggml_type})
    t = GGUFContainer(path).tensor("w")
    from_gguf = QuantizedLinear(t.data, t.ggml_type, 64, 96, b, target="i8mm")
    from_floats = QuantizedLinear.from_float(w, ggml_type, b, target="i8mm")
    assert from_gguf.linear.packed.tobytes() == from_floats.linear.packed.tobytes()
    x = _normal(rng, 5, 96)
    assert from_gguf(x).tobytes() == from_floats(x).tobytes()
    flat = QuantizedLinear(np.asarray(t.data).reshape(-1), ggml_type.name.lower(), 64, 96, b, target="i8mm")
    assert flat(x).tobytes() == from_floats(x).tobytes()


def test_threads_1_and_2_give_the_same_bits():
    rng = _rng(4)
    n, k, m = 512, 512, 8  # m·n·k = 2²¹ multiply-adds: large enough for the backend to split the GEMM
    w, x = _normal(rng, n, k), _normal(rng, m, k)
    with mock.patch.object(matmul, "parallel_map", wraps=matmul.parallel_map) as pool:
        one = QuantizedLinear.from_float(w, "q4_0", target="sme2", threads=1)(x)
        assert pool.call_count == 0
        two = QuantizedLinear.from_float(w, "q4_0", target="sme2", threads=2)(x)
        assert [len(c.args[1]) for c in pool.call_args_list] == [2]  # the columns went to two threads
    assert one.tobytes() == two.tobytes()


def test_shapes():
    rng = _rng(5)
    layer = QuantizedLinear.from_float(_normal(rng, 32, 64), "q8_0", target="dotprod")
    x = _normal(rng, 64)
    assert layer(x).shape == (32,) and layer(x).tobytes() == layer(x[None])[0].tobytes()
    assert layer(np.zeros((0, 4, 64), np.float32)).shape == (0, 4, 32)
    assert layer(np.asfortranarray(_normal(rng, 3, 64))).shape == (3, 32)


def _bad_inputs():
    w, blocks = np.ones((32, 64), np.float32), formats.quantize(np.ones((32, 64), np.float32), T.Q4_0)
    layer = QuantizedLinear(blocks, T.Q4_0, 32, 64, target="dotprod")
    nan = np.ones((2, 64), np.float32)
    nan[1, 5] = np.nan
    return {
        "float64 input": (lambda: layer(np.ones((2, 64))), DTypeError),
        "list input": (lambda: layer([[1.0] * 64]), DTypeError),
        "wrong k": (lambda: layer(np.ones((2, 63), np.float32)), KernelShapeError),
        "scalar input": (lambda: layer(np.float32(1.0)), DTypeError),
        "0-d input": (lambda: layer(np.array(1.0, np.float32)), KernelShapeError),
        "NaN input": (lambda: layer(nan), NonFiniteInputError),
        "k not a multiple of 32": (lambda: QuantizedLinear.from_float(np.ones((4, 48), np.float32)), KernelShapeError),
        "1-D weight": (lambda: QuantizedLinear.from_float(np.ones(64, np.float32)), KernelShapeError),
        "int weight": (lambda: QuantizedLinear.from_float(np.ones((4, 64), np.int32)), DTypeError),
        "Inf weight": (lambda: QuantizedLinear.from_float(np.full((4, 64), np.inf, np.float32)), NonFiniteInputError),
        "F16 type": (lambda: QuantizedLinear.from_float(w, "f16"), UnsupportedTensorTypeError),
        "Q5_0 type": (lambda: QuantizedLinear.from_float(w, T.Q5_0), UnsupportedTensorTypeError),
        "unknown type": (lambda: QuantizedLinear.from_float(w, "q3_x"), UnsupportedTensorTypeError),
        "bias length": (lambda: QuantizedLinear.from_float(w, bias=np.ones(31, np.float32)), KernelShapeError),
        "NaN bias": (lambda: QuantizedLinear.from_float(w, bias=np.full(32, np.nan)), NonFiniteInputError),
        "short blocks": (lambda: QuantizedLinear(blocks.reshape(-1)[:-1], T.Q4_0, 32, 64), BufferSizeError),
        "blocks of another type": (lambda: QuantizedLinear(blocks, T.Q8_0, 32, 64), BufferSizeError),
        "float blocks": (lambda: QuantizedLinear(blocks.astype(np.float32), T.Q4_0, 32, 64), DTypeError),
        "zero features": (lambda: QuantizedLinear(blocks[:0], T.Q4_0, 0, 64), KernelShapeError),
        "float features": (lambda: QuantizedLinear(blocks, T.Q4_0, 32.0, 64), KernelShapeError),
        "threads 0": (lambda: QuantizedLinear(blocks, T.Q4_0, 32, 64, threads=0), InvalidArgumentError),
        "bad target": (lambda: QuantizedLinear(blocks, T.Q4_0, 32, 64, target="sve9"), TargetError),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_input_raises_a_typed_error(case):
    call, error = _bad_inputs()[case]
    with pytest.raises(error) as info:
        call()
    assert type(info.value).__module__ == "kleidipy.errors", type(info.value)


# --------------------------------------------------------------------------------------------- PyTorch


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (optional extra: pip install kleidipy[torch])")


def _mlp(torch):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(), nn.Linear(96, 32, bias=False))


def _block(torch):
    """A tiny pre-norm transformer block: causal attention (q, k, v, o projections) and a GELU MLP."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, dim: int = 64, heads: int = 2):
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, dim = x.shape
            h = self.norm1(x)
            q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, dim)
            x = x + self.o(a)
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    torch.manual_seed(1)
    return Block()


def _record_linears(torch, model):
    """{name: (input, output)} of every KleidiLinear on the next forward, through forward hooks."""
    from kleidipy.nn.torch import KleidiLinear

    seen = {}
    for name, mod in model.named_modules():
        if isinstance(mod, KleidiLinear):
            mod.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out)))
    return seen


def _check_layers(torch, float_model, seen, spec):
    """Each converted layer, on the input it was given: the bits of the runtime's kernels on GGML's Q4_0 bytes of
    the float weight (+ bias), and within the Q4_0 bound of the float layer."""
    floats = dict(float_model.named_modules())
    assert seen and set(seen) == {n for n, m in floats.items() if type(m) is torch.nn.Linear}
    for name, (x, y) in seen.items():
        w = floats[name].weight.detach().numpy()
        b = None if floats[name].bias is None else floats[name].bias.detach().numpy()
        rows = x.detach().numpy().reshape(-1, w.shape[1])
        ref = KleidiBackend(parse_target(spec))(name, T.Q4_0, w.shape[::-1], formats.quantize(w, T.Q4_0))(rows)
        got = y.detach().numpy().reshape(-1, w.shape[0])
        assert got.tobytes() == (ref if b is None else ref + b).tobytes(), name
        assert (np.abs(got - _exact(rows, w, b)) <= q4_0_bound(rows, w)).all(), name


@pytest.mark.torch
@pytest.mark.parametrize("spec", ["sme2", "i8mm"])
def test_converted_mlp_is_the_kernels_and_within_the_q4_0_bound(torch, spec):
    from kleidipy.nn.torch import KleidiLinear, convert

    model = _mlp(torch)
    converted = convert(copy.deepcopy(model), "q4_0", target=spec)
    assert [type(m) for m in converted] == [KleidiLinear, torch.nn.ReLU, KleidiLinear, torch.nn.ReLU, KleidiLinear]
    seen = _record_linears(torch, converted)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        y = converted(x)
    _check_layers(torch, model, seen, spec)
    # end to end: the numpy layers chained give the same bits
    h = x.numpy()
    for i in (0, 2, 4):
        h = converted[i].layer(h)
        h = np.maximum(h, 0) if i < 4 else h
    assert y.numpy().tobytes() == h.tobytes()


@pytest.mark.torch
def test_converted_transformer_block(torch):
    from kleidipy.nn.torch import convert

    block = _block(torch)
    converted = convert(copy.deepcopy(block), "q4_0", target="sme2")
    seen = _record_linears(torch, converted)
    x = torch.randn(1, 6, 64)
    with torch.no_grad():
        y, ref = converted(x), block(x)
    _check_layers(torch, block, seen, "sme2")
    assert y.shape == ref.shape and torch.isfinite(y).all()


@pytest.mark.torch
def test_torch_compile_gives_the_same_bits(torch, tmp_path, monkeypatch):
    from kleidipy.nn.torch import convert

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # inductor's generated code goes here

    model = convert(_mlp(torch), "q4_0", target="sme2")
    x = torch.randn(3, 64)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model)(x)
    assert torch.equal(eager, compiled)
    assert torch.equal(torch.ops.kleidipy.quantized_linear(x, model[0].layer_id, 128), model[0](x))


@pytest.mark.torch
def test_torch_errors_and_choices(torch):
    from kleidipy.nn.torch import KleidiLinear, convert

    nn = torch.nn
    layer = KleidiLinear.from_linear(nn.Linear(64, 32), "q8_0", target="dotprod")
    with pytest.raises(DTypeError):
        layer(torch.ones(2, 64, dtype=torch.float64))
    with pytest.raises(KernelShapeError):
        layer(torch.ones(2, 63))
    with pytest.raises(KernelShapeError, match="^1: "):
        convert(nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 8)))
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 32))
    convert(model, "q4_1", include=lambda name, lin: lin.out_features == 32)
    assert type(model[0]) is nn.Linear and isinstance(model[1], KleidiLinear)
    assert model[1].layer.weight_type == T.Q4_1
    x = torch.randn(3, 64)
    copied = copy.deepcopy(layer)
    y, layer_id = layer(x), layer.layer_id
    del layer
    assert copied.layer_id != layer_id and torch.equal(copied(x), y)
    attention = convert(nn.Sequential(nn.MultiheadAttention(64, 2)))
    assert type(attention[0].out_proj) is not KleidiLinear  # an nn.Linear subclass whose owner reads .weight
    assert isinstance(convert(nn.Linear(32, 8), target="i8mm"), KleidiLinear)
