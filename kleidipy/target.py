"""Targets: the Arm CPU whose KleidiAI kernels kleidipy runs, and llama.cpp's kernel selection for it.

A :class:`Target` is a set of Arm features (dotprod, i8mm, sme, sme2, ...) and, with SME, a streaming
vector length. It decides *which* layouts and kernels are used; how they execute on the host (numpy
reference, numba JIT, emulator) is chosen separately. On an aarch64 Linux host the features come from
HWCAP/HWCAP2 (``getauxval``) and the SVL from ``prctl(PR_SME_GET_VL)``; elsewhere the default target is
a virtual SME2 CPU with SVL 512. Users name a target with ``--target`` or ``KLEIDIPY_TARGET``:
``sme2:svl=512``, ``sme:svl=256``, ``i8mm``, ``dotprod``, ``host``.

Selection follows llama.cpp's KleidiAI tables (spec §6.2): per weight type, the first entry whose
required features the target has, in the order SME2 → I8MM → DotProd; one RHS packing (made with the
GEMM kernel's nr/kr/sr) serves the GEMM (m > 1) and the GEMV (m == 1) of a pair. Two tables: ``master``
(the default: llama.cpp's master, whose SME2 Q4_0 pair is the F16-LHS MOPA GEMM with the int8 SDOT GEMV) and
``seeds`` (the table of the llama.cpp the seeds were traced on: the int8 MOPA GEMM at prefill), chosen by the
target option ``table=``: ``sme2:svl=512,table=seeds``, ``host:table=seeds``. :func:`standing` says
where any kernel, packer or folder name (legacy spellings included) stands in that selection. With ``sme_threads=N``
(``sme2:svl=512,sme_threads=1``) an SME target runs llama.cpp's SME/NEON hybrid: :func:`fallback_kernels` names the
NEON pair it chains behind the SME one, :func:`~kleidipy.core.threads.sme_columns` the columns each computes.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, replace

from kleidipy.core import hwcaps
from kleidipy.core.buffers import check_svl
from kleidipy.core.matmul import MatmulKernel
from kleidipy.core.names import folder, kind
from kleidipy.errors import TargetError, UnknownKernelError
from kleidipy.kernels.catalogue import all_kernels, family_of, get_kernel, get_packer

#: the host features a target records (those the kernel selection and its description name)
_MATMUL_FEATURES = frozenset({"dotprod", "sve", "sve2", "i8mm", "bf16", "sme", "sme2"})

#: llama.cpp's selection tables (:func:`selection_table`), the default first
TABLES = ("master", "seeds")
DEFAULT_TABLE = TABLES[0]

#: features each named target has (a CPU with SME2 has the NEON extensions too).
_NAMED = {
    "sme2": frozenset({"dotprod", "i8mm", "bf16", "sme", "sme2"}),
    "sme": frozenset({"dotprod", "i8mm", "bf16", "sme"}),
    "i8mm": frozenset({"dotprod", "i8mm", "bf16"}),
    "dotprod": frozenset({"dotprod"}),
}


@dataclass(frozen=True)
class Target:
    """An Arm CPU as far as KleidiAI kernel choice is concerned."""

    name: str
    features: frozenset[str]
    svl_bits: int | None = None
    virtual: bool = True  # True unless detected on the host we run on
    source: str = ""  # how it was chosen: "detected", "--target", "KLEIDIPY_TARGET", "default"
    table: str = "master"  # llama.cpp's selection table the target follows (:data:`TABLES`)
    #: threads that run the SME kernels, the others the NEON fallback (llama.cpp's GGML_KLEIDIAI_SME=N); None: SME on
    #: every thread
    sme_threads: int | None = None

    def has(self, *features: str) -> bool:
        return set(features) <= self.features

    def spec(self) -> str:
        """The ``--target`` text that names this target again (``host`` for the detected one)."""
        opts = [f"svl={self.svl_bits}"] if self.svl_bits and self.virtual else []
        opts += [f"table={self.table}"] if self.table != DEFAULT_TABLE else []
        opts += [f"sme_threads={self.sme_threads}"] if self.sme_threads is not None else []
        base = self.name if self.virtual else "host"
        return f"{base}:{','.join(opts)}" if opts else base

    def describe(self) -> str:
        svl = f", SVL {self.svl_bits}" if self.svl_bits else ""
        kind = "virtual " if self.virtual else ""
        feats = ", ".join(sorted(self.features)) or "no Arm matmul features"
        hybrid = f", SME kernels on {self.sme_threads} thread(s)" if self.sme_threads is not None else ""
        return f"{kind}{self.name.upper()} CPU{svl} ({feats}), llama.cpp's {self.table} kernel table{hybrid}"


def parse_target(spec: str, source: str = "--target") -> Target:
    """Parse ``sme2[:svl=N]``, ``sme[:svl=N]``, ``i8mm``, ``dotprod`` or ``host``, each with an optional
    ``table=master|seeds`` (``sme2:svl=512,table=seeds``, ``host:table=seeds``) and, for an SME CPU,
    ``sme_threads=N`` (:func:`with_sme_threads`)."""
    text = spec.strip().lower()
    name, _, opts = text.partition(":")
    if name in ("auto", ""):
        name = "host"
    if name != "host" and name not in _NAMED:
        raise TargetError(f"unknown target '{spec}': use sme2[:svl=N], sme[:svl=N], i8mm, dotprod or host")
    svl, table, sme_threads = None, None, None
    for opt in filter(None, opts.split(",")):
        key, _, value = opt.partition("=")
        if key == "table" and value in TABLES:
            table = value
        elif key == "svl" and value.isdigit() and name != "host":
            svl = int(value)
        elif key == "sme_threads":
            sme_threads = value
        else:
            raise TargetError(
                f"target '{spec}': unknown option '{opt}' (svl=BITS for sme/sme2, table={'|'.join(TABLES)}, "
                "sme_threads=N for sme/sme2)"
            )
    if name == "host":
        host = detect_target()
        return with_sme_threads(host if table is None else replace(host, table=table), sme_threads)
    if name in ("sme", "sme2"):
        try:
            svl = check_svl(svl or 512)
        except Exception as exc:
            raise TargetError(f"target '{spec}': {exc}") from None
    elif svl is not None:
        raise TargetError(f"target '{spec}': svl applies only to sme/sme2 targets")
    target = Target(name, _NAMED[name], svl, virtual=True, source=source, table=table or DEFAULT_TABLE)
    return with_sme_threads(target, sme_threads)


def with_sme_threads(target: Target, sme_threads: int | str | None) -> Target:
    """``target`` running the SME kernels on ``sme_threads`` threads and the NEON fallback on the others, as
    llama.cpp with ``GGML_KLEIDIAI_SME=N`` (None: ``target`` as it is). TargetError for a count that is not an
    integer >= 1 (0 is llama.cpp's SME off: the ``i8mm`` target) or a target without SME."""
    if sme_threads is None:
        return target
    text = str(sme_threads).strip()
    if not text.isdigit() or int(text) < 1:
        raise TargetError(
            f"sme_threads={sme_threads}: give an integer >= 1 (llama.cpp's GGML_KLEIDIAI_SME=0, SME off, is "
            "--target i8mm)"
        )
    if not target.has("sme"):
        raise TargetError(f"sme_threads={text}: the {target.name} target has no SME (use sme2[:svl=N] or sme)")
    return replace(target, sme_threads=int(text))


def detect_target() -> Target:
    """The host as a target; a virtual SME2 CPU with SVL 512 when the host has no Arm matmul features, following the
    seeds' table there: master's F16-LHS GEMM has no x86 tiles (portable loops, ~9x slower prefill on an AVX-512
    VNNI core), the seeds' int8 MOPA GEMM has (``--target sme2`` takes master's)."""
    if hwcaps.is_arm64_host():
        feats, svl = hwcaps.arm_features()
        feats &= _MATMUL_FEATURES
        for name in ("sme2", "sme", "i8mm", "dotprod"):
            if name in feats and (name not in ("sme", "sme2") or svl):
                return Target(name, feats, svl if name in ("sme", "sme2") else None, virtual=False, source="detected")
    return Target("sme2", _NAMED["sme2"], 512, virtual=True, source="default", table="seeds")


def resolve_target(spec: str | None = None) -> Target:
    """``spec`` if given, else ``$KLEIDIPY_TARGET``, else the detected host (or the virtual SME2 default)."""
    if spec:
        return parse_target(spec, "--target")
    env = os.environ.get("KLEIDIPY_TARGET")
    if env:
        return parse_target(env, "KLEIDIPY_TARGET")
    return detect_target()


# --------------------------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class KernelPair:
    """What a target runs for one weight type: a GEMM (m > 1) and a GEMV (m == 1) sharing one RHS packing."""

    weight_type: str
    requires: frozenset[str]
    gemm: MatmulKernel
    gemv: MatmulKernel

    def for_m(self, m: int) -> MatmulKernel:
        return self.gemv if m == 1 else self.gemm

    @property
    def exact_rows(self) -> bool:
        """Whether a GEMM row is bit for bit the GEMV of that row (one kernel, or one family whose rows are exact:
        :attr:`~kleidipy.core.family.Family.exact_rows`)."""
        family = family_of(self.gemm)
        return self.gemv is self.gemm or (family is family_of(self.gemv) and family.exact_rows)


#: (weight type, required features, GEMM kernel, GEMV kernel) in llama.cpp's order (spec §6.2): the seeds' table.
#: Q4_1, the F16 NEON/F32 entries and the exact-weight ones are kleidipy's own (llama.cpp runs them without
#: KleidiAI): ``qai8c16`` the GGML types whose values are int8 codes with an f32 scale and offset per 16 values
#: (Q5_0, Q5_1, Q5_K, Q6_K, IQ4_NL, Q8_0 with exact weights; :mod:`kleidipy.formats.codes16`), ``f32`` float weights
#: kept exactly (F16, BF16 and F32 with exact weights).
_SEEDS: tuple[tuple[str, frozenset[str], str, str], ...] = (
    (
        "q4_0",
        frozenset({"sme2"}),
        "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa",
        "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot",
    ),
    (
        "q4_0",
        frozenset({"i8mm", "dotprod"}),
        "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm",
        "matmul_clamp_f32_qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod",
    ),
    (
        "q4_0",
        frozenset({"dotprod"}),
        "matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod",
        "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod",
    ),
    (
        "q8_0",
        frozenset({"sme2"}),
        "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa",
        "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot",
    ),
    (
        "q8_0",
        frozenset({"i8mm", "dotprod"}),
        "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm",
        "matmul_clamp_f32_qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod",
    ),
    (
        "q8_0",
        frozenset({"dotprod"}),
        "matmul_clamp_f32_qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod",
        "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod",
    ),
    (
        "q4_1",
        frozenset({"sme2"}),
        "matmul_clamp_f32_qsi8d32p1vlx4_qai4c32p4vlx4_1vlx4vl_sme2_mopa",
        "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4vlx4_1x4vl_sme2_dot",
    ),
    (
        "q4_1",
        frozenset({"i8mm", "dotprod"}),
        "matmul_clamp_f32_qsi8d32p4x8_qai4c32p4x8_8x4_neon_i8mm",
        "matmul_clamp_f32_qsi8d32p1x8_qai4c32p4x8_1x4_neon_dotprod",
    ),
    (
        "q4_1",
        frozenset({"dotprod"}),
        "matmul_clamp_f32_qsi8d32p4x4_qai4c32p4x4_8x4_neon_dotprod",
        "matmul_clamp_f32_qsi8d32p1x4_qai4c32p4x4_1x4_neon_dotprod",
    ),
    (
        "f16",
        frozenset({"sme2"}),
        "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa",
        "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa",
    ),
    (
        "f16",
        frozenset({"bf16"}),
        "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla",
        "matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x36_neon_dot",
    ),
    (
        "f16",
        frozenset(),
        "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla",
        "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla",
    ),
    (
        "qai8c16",
        frozenset({"dotprod"}),
        "matmul_clamp_f32_qsi8d32p4x4_qai8c16p16x4_4x16_neon_dotprod",
        "matmul_clamp_f32_qsi8d32p1x4_qai8c16p16x4_1x16_neon_dotprod",
    ),
    (
        "f32",
        frozenset(),
        "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla",
        "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla",
    ),
)

#: llama.cpp master's first Q4_0 entry (kernels.cpp, required SME2 | FP16; every SME CPU has FP16: FEAT_SME requires
#: FEAT_FP16): the F16-LHS MOPA GEMM at prefill and the int8 SDOT GEMV at decode, on one packing of the weights
#: (rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon, nr = 4·VL, kr = 4, sr = 2 for both kernels). It takes the
#: place of the seeds' int8 MOPA pair, which master no longer lists; the other entries are the seeds'.
_MASTER_Q4_0_SME2 = (
    "q4_0",
    frozenset({"sme2"}),
    "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa",
    "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot",
)
#: llama.cpp master's F32 table (kernels.cpp ``ggml_kleidiai_kernels_f32``, its SME2 entry; the SME one is not
#: kleidipy's): the F32 2-D weights of a MUL_MAT (kleidiai.cpp ``supports_op``: src0 F32 with two dimensions, src1 and
#: dst F32; not GET_ROWS, so not a tied token_embd) packed as stored by rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme with
#: zero biases (``repack``), the MOPA GEMM at m > 1 and, at m == 1, the MLA GEMV on the same packing
#: (``compute_forward_f32``). Without SME llama.cpp's KleidiAI takes no F32 weight: kleidipy's F16 route then, as
#: before. The seeds' table has none.
F32_KLEIDIAI = "f32_kleidiai"
_MASTER_F32_SME2 = (
    F32_KLEIDIAI,
    frozenset({"sme2"}),
    "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa",
    "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla",
)
#: the seeds' F16 entry on NEON BF16 (the weights rounded to bf16), which master's kernels.cpp does not list: without
#: SME2 llama.cpp master multiplies F16 weights with ggml's own F16 code, the weights as stored, so master's table
#: takes them on the F32 NEON kernel (exact weights, issue 51)
_SEEDS_F16_NEON_BF16 = next(e for e in _SEEDS if e[0] == "f16" and e[1] == frozenset({"bf16"}))
_TABLES = {
    "master": (_MASTER_Q4_0_SME2, *(e for e in _SEEDS[1:] if e is not _SEEDS_F16_NEON_BF16), _MASTER_F32_SME2),
    "seeds": _SEEDS,
}

#: llama.cpp master's GEMM of the F16 KV cache, per table: (required features, GEMM name), first match. kleidiai.cpp's
#: extra buffer takes a MUL_MAT whose src0 is F16 and not a repacked weight when src1 has more than one row and both
#: operands' batches are contiguous (``get_tensor_traits``), and packs both operands at each call
#: (``compute_forward_fp16``: src0 F16 -> f32 K x N -> rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme, src1 through
#: lhs_pack_bf16p2vlx2_f32_sme) for kernels.cpp's SME2 F16 entry. Of attention without flash attention only the KQV
#: (V's transposed view) passes the contiguity test, at prefill; decode and KQ stay ggml's. The seeds have none.
_KV_GEMM = {"master": ((frozenset({"sme2"}), "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa"),), "seeds": ()}

WEIGHT_TYPES = ("q4_0", "q8_0", "q4_1", "f16", "qai8c16", "f32", F32_KLEIDIAI)


def selection_table(table: str = DEFAULT_TABLE) -> tuple[tuple[str, frozenset[str], str, str], ...]:
    """The raw table ``table`` (:data:`TABLES`): (weight type, required features, GEMM name, GEMV name), in
    priority order."""
    if table not in _TABLES:
        raise TargetError(f"no kernel table '{table}' (tables: {', '.join(TABLES)})")
    return _TABLES[table]


def select_kernels(weight_type: str, target: Target) -> KernelPair:
    """The first entry for ``weight_type`` of the target's table whose required features ``target`` has."""
    wtype = weight_type.lower()
    if wtype not in WEIGHT_TYPES:
        raise TargetError(f"no KleidiAI kernels for weight type '{weight_type}' (supported: {', '.join(WEIGHT_TYPES)})")
    for typ, requires, gemm, gemv in selection_table(target.table):
        if typ == wtype and target.has(*requires):
            return KernelPair(wtype, requires, get_kernel(gemm, target.svl_bits), get_kernel(gemv, target.svl_bits))
    raise TargetError(f"target {target.describe()} has no kernel for {weight_type}")


def has_kernels(weight_type: str, target: Target) -> bool:
    """Whether the target's table has an entry for ``weight_type`` whose required features ``target`` has."""
    return any(typ == weight_type and target.has(*req) for typ, req, _, _ in selection_table(target.table))


def select_kv_gemm(target: Target) -> MatmulKernel | None:
    """The GEMM of the target's table for the KQV of a batch over an F16 KV cache (attention without flash
    attention, more than one token), or None: ggml's own F16 matmul."""
    selection_table(target.table)  # (an unknown table raises)
    for requires, gemm in _KV_GEMM[target.table]:
        if target.has(*requires):
            return get_kernel(gemm, target.svl_bits)
    return None


#: the weight types whose SME kernels llama.cpp chains a NEON fallback behind (compute_forward_qx: Q4_0 and Q8_0)
HYBRID_TYPES = ("q4_0", "q8_0")


def fallback_kernels(weight_type: str, target: Target) -> KernelPair | None:
    """The NEON pair llama.cpp runs on the threads past ``target.sme_threads`` for ``weight_type`` (its kernel chain,
    ``kleidiai_collect_kernel_chain_common``: the selection for the target's features without SME and SME2, when
    the first pair is an SME one of the same types), or None: no hybrid (SME on every thread, or not an SME pair)."""
    wtype = weight_type.lower()
    if target.sme_threads is None or wtype not in HYBRID_TYPES:
        return None
    pair = select_kernels(wtype, target)
    if not pair.requires & {"sme", "sme2"}:
        return None
    return select_kernels(wtype, replace(target, features=target.features - {"sme", "sme2"}, svl_bits=None))


def selected_uses(target: Target) -> dict[str, list[str]]:
    """What ``target`` runs each kernel it selects for: kernel name -> ["q4_0 GEMM", "q4_0 GEMV", ...,
    "F16 KV cache GEMM"]."""
    uses: dict[str, list[str]] = {}
    for wtype in WEIGHT_TYPES:
        try:
            pair = select_kernels(wtype, target)
        except TargetError:
            continue
        uses.setdefault(pair.gemm.name, []).append(f"{wtype} GEMM")
        uses.setdefault(pair.gemv.name, []).append(f"{wtype} GEMV")
        if fallback := fallback_kernels(wtype, target):
            uses.setdefault(fallback.gemm.name, []).append(f"{wtype} GEMM (NEON threads)")
            uses.setdefault(fallback.gemv.name, []).append(f"{wtype} GEMV (NEON threads)")
    kv = select_kv_gemm(target)
    if kv is not None:
        uses.setdefault(kv.name, []).append("F16 KV cache GEMM")
    return uses


def _kernels(n: int) -> str:
    return f"{n} kernel{'s' * (n != 1)}"


def _entries(name: str) -> tuple[str, list[MatmulKernel]]:
    """What ``name`` is in the catalogue, and the kernels that are it, use it (a packer) or form it (a folder)."""
    kernels = all_kernels()
    if kind(name) == "packer":
        packer = get_packer(name)
        users = [k for k in kernels if packer in (k.lhs_packer, k.rhs_packer, *k.alt_lhs_packers, *k.alt_rhs_packers)]
        families = ", ".join(sorted({k.family for k in users}))
        return f"{packer.side.upper()} packer of {_kernels(len(users))} (family {families})", users
    if kind(name) == "folder":
        home = folder(name)
        members = [k for k in kernels if folder(k.name) == home]
        if not members:
            raise UnknownKernelError(f"no kernel of folder '{home}'")
        tiers = ", ".join(sorted({k.tier for k in members}))
        return f"family {members[0].family}, {_kernels(len(members))} (tiers {tiers})", members
    kernel = get_kernel(name)
    return f"family {kernel.family}, tier {kernel.tier}, {kernel.kind.upper()}", [kernel]


def _selection(kernels: list[MatmulKernel], target: Target) -> str:
    """What ``target`` selects of ``kernels`` (or, when nothing, of their family instead)."""
    uses = selected_uses(target)

    def picks(among: list[MatmulKernel]) -> str:
        return "; ".join(f"kai_{k.name} for {', '.join(uses[k.name])}" for k in among if k.name in uses)

    families = {k.family for k in kernels}
    if picks(kernels):
        return f"the {target.name} target selects {picks(kernels)}"
    if siblings := picks([k for k in all_kernels() if k.family in families]):
        return f"the {target.name} target selects none of it; of its family it selects {siblings}"
    return f"the {target.name} target selects no kernel of family {', '.join(sorted(families))}"


def standing(name: str, target: Target, width: int = 110) -> str:
    """Where the kernel, packer or folder ``name`` (legacy spellings too) stands in kleidipy: its family and
    tier, and what ``target`` selects of it; a name kleidipy lacks says so, with the closest one it has."""
    try:
        what, kernels = _entries(name)
    except UnknownKernelError as exc:
        line = f"not in the catalogue ({exc})"
    else:
        line = f"{what}; {_selection(kernels, target)}"
    return textwrap.fill(f"in kleidipy: {line}", width, subsequent_indent="  ")
