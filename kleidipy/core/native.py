"""Native tiles: LLVM modules built apart from numba's own code, for the instructions numba cannot emit.

Owns the named instruction sets kleidipy compiles tiles for (:data:`ISAS`: an LLVM triple and feature list
each), :func:`host_isa` (the first of a family's ISAs this host runs, from the features kleidipy itself detects —
HWCAP/HWCAP2 on Linux aarch64, sysctl on macOS arm64 — never LLVM's guess of the host CPU, which under emulation
reads the x86 host, and never a feature the CPU lacks: LLVM aborts the whole process on an instruction it cannot
select),
:func:`assembly` (a module cross-compiled for any of them, on any host: what ``kleidipy kernels --asm``
shows), :func:`install` (a module compiled for this host, its functions registered as LLVM symbols) and
:func:`caller` (a numba intrinsic that calls such a symbol by name: the numba functions calling it stay
cacheable — the symbol is resolved whenever their code is loaded; :func:`shape_caller`, one of a family's tiles by
its shape).

Hand-written because numba generates code for one target only, with its own guess of the CPU, and its portable
IR never lowers to the Arm dot-product instructions (``sdot``, ``smmla``) nor to SME (streaming mode, ZA; scalable
vectors cannot even go through numba's backend on a host without them): a tile that uses them must be its own
module — llvmlite IR or IR text — compiled for the features the host has, and called through a plain C interface
(integers and pointers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core import config as numba_config
from numba.extending import intrinsic

from kleidipy.core import hwcaps

llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()


@dataclass(frozen=True)
class NativeIsa:
    """An instruction set tiles are compiled for: ``name`` (``aarch64-i8mm``, ...), the LLVM ``triple`` and the
    LLVM ``features`` enabled (nothing else: cross-compiled code uses exactly these)."""

    name: str
    triple: str
    features: tuple[str, ...]
    #: the Arm features (HWCAP names) a host needs to run it
    needs: frozenset[str] = frozenset()

    def has(self, feature: str) -> bool:
        """Whether code for this ISA may use the LLVM feature (``"+i8mm"``, ...)."""
        return feature in self.features

    def target_machine(self, jit: bool = False) -> llvm.TargetMachine:
        """LLVM's target machine for this ISA; with ``jit``, code for this host (its own triple: Linux or macOS)."""
        triple = llvm.get_process_triple() if jit else self.triple
        target = llvm.Target.from_triple(triple)
        return target.create_target_machine(cpu="generic", features=",".join(self.features), opt=3, jit=jit)


_AARCH64 = "aarch64-unknown-linux-gnu"
#: the instruction sets of kleidipy's native tiles, by name
ISAS = {
    isa.name: isa
    for isa in (
        NativeIsa("aarch64-dotprod", _AARCH64, ("+neon", "+dotprod"), frozenset({"asimd", "dotprod"})),
        NativeIsa("aarch64-i8mm", _AARCH64, ("+neon", "+dotprod", "+i8mm"), frozenset({"asimd", "dotprod", "i8mm"})),
        NativeIsa("aarch64-bf16", _AARCH64, ("+neon", "+bf16"), frozenset({"asimd", "bf16"})),
        NativeIsa("aarch64-sme", _AARCH64, ("+neon", "+sme"), frozenset({"asimd", "sme"})),
        NativeIsa("aarch64-sme2", _AARCH64, ("+neon", "+sme", "+sme2"), frozenset({"asimd", "sme", "sme2"})),
        NativeIsa(
            "x86-vnni",
            "x86_64-unknown-linux-gnu",
            ("+avx512f", "+avx512bw", "+avx512vl", "+avx512vnni", "+avx512vbmi", "+f16c", "+fma"),
        ),
    )
}


def host_isa(*names: str) -> NativeIsa | None:
    """The first of the named ISAs this host runs (Linux aarch64 from HWCAP, macOS arm64 from sysctl), or None
    (other hosts: numba's own code is native there, or there is nothing better than portable code; and wherever
    numba is told to compile for a generic CPU, ``NUMBA_CPU_NAME=generic``: portable code only). A family asks
    for the ISAs its tiles have, richest first: NEON tiles ``host_isa("aarch64-i8mm", "aarch64-dotprod")``."""
    if not hwcaps.is_arm64_host() or str(numba_config.CPU_NAME).lower() == "generic":
        return None
    features = hwcaps.arm_features()[0]
    for name in names:
        isa = ISAS[name]
        if isa.triple == _AARCH64 and isa.needs <= features:
            return isa
    return None


def _optimized(module: ir.Module | str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(str(module))
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def assembly(module: ir.Module | str, isa: NativeIsa) -> str:
    """The assembly of a module (or its IR text: scalable vectors and SME attributes, which llvmlite's IR builder
    lacks) optimised (O3) and compiled for ``isa``, on any host."""
    tm = isa.target_machine()
    return tm.emit_assembly(_optimized(module, tm))


#: execution engines of the installed modules (kept alive: their code is called through the symbols)
_ENGINES: list[llvm.ExecutionEngine] = []


def install(module: ir.Module | str, isa: NativeIsa) -> None:
    """Compile a module (or its IR text) for this host (which must run ``isa``) and register each function it
    defines with external linkage as an LLVM symbol of its own name, for :func:`caller`."""
    tm = isa.target_machine(jit=True)
    mod = _optimized(module, tm)
    local = (llvm.Linkage.internal, llvm.Linkage.private)
    names = [fn.name for fn in mod.functions if not fn.is_declaration and fn.linkage not in local]
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    for name in names:
        llvm.add_symbol(name, engine.get_function_address(name))
    _ENGINES.append(engine)


def install_tiles(isa: NativeIsa | None, modules: Callable[[NativeIsa], Iterable[ir.Module | str]]) -> NativeIsa | None:
    """:func:`install` each of a family module's tiles, ``modules(isa)``, for ``isa`` (the :func:`host_isa` of its
    tiles; None: this host runs none of them, nothing is built); returns ``isa``, the module's ``HOST_ISA``."""
    if isa is not None:
        for module in modules(isa):
            install(module, isa)
    return isa


def _integers(ty: types.Type) -> bool:
    """Whether a numba type is a tuple of integers."""
    return isinstance(ty, types.BaseTuple) and all(isinstance(t, types.Integer) for t in ty)


def _native_arguments(ints: types.Type, arrays: tuple[types.Type, ...]) -> bool:
    """Whether a native call takes these numba types: a tuple of integers and three C-contiguous arrays."""
    return _integers(ints) and all(isinstance(t, types.Array) and t.layout == "C" for t in arrays)


def _call_native(context, builder: ir.IRBuilder, symbol: str, ints: types.BaseTuple, arrays: tuple, args: list) -> None:
    """The call of ``void symbol(i64 ×len(ints), i8* a, i8* b, i8* c)`` with ``args`` (the tuple of integers, then
    the three arrays of numba types ``arrays``)."""
    i64, ptr = ir.IntType(64), ir.IntType(8).as_pointer()
    values = [context.cast(builder, builder.extract_value(args[0], i), t, types.int64) for i, t in enumerate(ints)]
    for ty, val in zip(arrays, args[1:], strict=True):
        values.append(builder.bitcast(context.make_array(ty)(context, builder, val).data, ptr))
    fnty = ir.FunctionType(ir.VoidType(), [i64] * len(ints) + [ptr] * 3)
    builder.call(cgutils.get_or_insert_function(builder.module, fnty, symbol), values)


def caller(symbol: str) -> Callable:
    """A numba intrinsic ``call(ints, a, b, c)`` of the native function ``void symbol(i64 ×len(ints), i8* a, i8* b,
    i8* c)``: ``ints`` a tuple of integers (passed as i64), a, b, c C-contiguous arrays (passed as pointers to their
    first element)."""

    @intrinsic
    def call(typingctx, ints, a, b, c):
        if not _native_arguments(ints, (a, b, c)):
            return None

        def codegen(context, builder, signature, args):
            _call_native(context, builder, symbol, ints, (a, b, c), args)
            return context.get_dummy_value()

        return types.void(ints, a, b, c), codegen

    return call


def shape_caller(symbol: Callable[[int, int], str], shapes: tuple[tuple[int, int], ...]) -> Callable:
    """A numba intrinsic ``call(shape, ints, a, b, c)``: :func:`caller`'s call of the native function
    ``symbol(*shape)``, ``shape`` a pair of integers among ``shapes`` (a family's tiles, one per shape; another
    pair calls none)."""

    @intrinsic
    def call(typingctx, shape, ints, a, b, c):
        if not (_integers(shape) and len(shape) == 2 and _native_arguments(ints, (a, b, c))):
            return None

        def codegen(context, builder, signature, args):
            fields = enumerate(shape)
            key = [context.cast(builder, builder.extract_value(args[0], i), t, types.int64) for i, t in fields]
            for pair in shapes:
                same = [builder.icmp_signed("==", v, ir.Constant(v.type, x)) for v, x in zip(key, pair, strict=True)]
                with builder.if_then(builder.and_(*same)):
                    _call_native(context, builder, symbol(*pair), ints, (a, b, c), args[1:])
            return context.get_dummy_value()

        return types.void(shape, ints, a, b, c), codegen

    return call
