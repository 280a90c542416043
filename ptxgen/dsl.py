"""The kernel author's vocabulary: `Tile`, `Pipeline`, `Schedule`, `Mma`, and dequant sequences built
from small ops. Each validates itself when constructed (or when bound to a target) and names the limit it
hit. The per-target lowering (`ptxgen.targets`) decides instructions; nothing here names an opcode
except the dequant ops, whose whole point is a particular instruction sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import formats
from .arch import Arch, ArchError
from .builder import KernelBuilder
from .ir import Imm, Mem, Reg


class SpecError(ValueError):
    """A kernel description that cannot be built, with the limit it hit."""


@dataclass(frozen=True)
class Tile:
    """Block tile (weight rows × tokens × K) and how warps split it."""

    m: int
    n: int
    k: int
    warps: int = 8
    warp_m: int = 64
    warp_n: int = 64

    def __post_init__(self):
        for name in ("m", "n", "k", "warps", "warp_m", "warp_n"):
            if getattr(self, name) <= 0:
                raise SpecError(f"Tile.{name} must be positive, got {getattr(self, name)}")
        if self.m % self.warp_m or self.n % self.warp_n:
            raise SpecError(f"Tile {self.m}×{self.n} is not a whole number of {self.warp_m}×{self.warp_n} warp tiles")
        if (self.m // self.warp_m) * (self.n // self.warp_n) != self.warps:
            raise SpecError(f"Tile {self.m}×{self.n} with warp tiles {self.warp_m}×{self.warp_n} needs "
                            f"{(self.m // self.warp_m) * (self.n // self.warp_n)} warps, not {self.warps}")
        if self.warp_m % 16 or self.warp_n % 8:
            raise SpecError(f"warp tile {self.warp_m}×{self.warp_n} must be a multiple of the mma shape 16×8")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def check_format(self, fmt: str) -> None:
        """A K tile must hold whole scale groups of the weight format (32 for Q4_K/Q5_K, 16 for Q6_K)."""
        group = {"q4_K": 32, "q5_K": 32, "q6_K": 16, "q8_0": 32, "tq4_1s": 32}.get(fmt, formats.get(fmt).block_size)
        if self.k % group:
            raise SpecError(f"Tile.k={self.k} splits a {fmt} scale group of {group} weights; use a multiple of {group}")


@dataclass(frozen=True)
class Pipeline:
    """`stages` shared-memory buffers in flight. The copy mechanism is the target's choice
    (cp.async on sm_89, TMA + mbarrier on sm_90a/sm_120a) unless pinned with `copy`."""

    stages: int = 3
    copy: str | None = None

    def __post_init__(self):
        if not 1 <= self.stages <= 16:
            raise SpecError(f"Pipeline.stages must be 1..16, got {self.stages}")
        if self.copy not in (None, "cp.async", "tma", "ld.global"):
            raise SpecError(f"Pipeline.copy must be cp.async, tma or ld.global, got {self.copy!r}")

    def check_smem(self, arch: Arch, bytes_per_stage: int) -> None:
        total = self.stages * bytes_per_stage
        if total > arch.max_smem_per_block:
            raise SpecError(f"{self.stages} stages × {bytes_per_stage} B = {total} B exceeds {arch.name}'s "
                            f"{arch.max_smem_per_block} B of shared memory per block")


@dataclass(frozen=True)
class Schedule:
    """"grid": one CTA per tile. "persistent": one CTA per SM claiming tiles from an atomic counter."""

    kind: str = "grid"

    def __post_init__(self):
        if self.kind not in ("grid", "persistent"):
            raise SpecError(f"Schedule.kind must be 'grid' or 'persistent', got {self.kind!r}")


@dataclass(frozen=True)
class Mma:
    """The tensor-core op. `instr` "auto" lets the target pick (wgmma where it exists)."""

    ab_type: str = "f16"
    instr: str = "auto"

    def __post_init__(self):
        if self.ab_type not in ("f16", "bf16", "s8"):
            raise SpecError(f"Mma.ab_type must be f16, bf16 or s8, got {self.ab_type!r}")
        if self.instr not in ("auto", "mma.sync", "wgmma"):
            raise SpecError(f"Mma.instr must be auto, mma.sync or wgmma, got {self.instr!r}")

    @property
    def shape(self) -> str:
        return "m16n8k32" if self.ab_type == "s8" else "m16n8k16"

    def check_registers(self, arch: Arch, tile: Tile, instr: str = "mma.sync") -> None:
        """The accumulators alone (warp tile / 32 lanes, 32-bit each) must leave room for operands and
        addresses: more than half the arch's registers per thread is refused at construction. wgmma's
        largest legal accumulator (m64n256: 128 registers) is allowed, for kernels that raise the consumers'
        register limit with setmaxnreg."""
        acc = tile.warp_m * tile.warp_n // 32
        budget = 128 if instr == "wgmma" else arch.max_regs_per_thread // 2
        if acc > budget:
            raise SpecError(f"warp tile {tile.warp_m}x{tile.warp_n} needs {acc} accumulator registers per thread; "
                            f"{arch.name} allows {arch.max_regs_per_thread}, and at most {budget} may be accumulators "
                            "- use a smaller warp tile or more warps")

    def resolve(self, arch: Arch, tile: Tile | None = None) -> str:
        if self.instr == "wgmma" or (self.instr == "auto" and arch.has_wgmma):
            if self.instr == "wgmma" and not arch.has_wgmma:
                raise ArchError(f"Mma(instr='wgmma') on {arch.name}: {arch.name} has no wgmma (ptxas rejects it); "
                                "use Mma(instr='mma.sync') or 'auto', which picks mma.sync there")
            if tile is not None:
                self.check_registers(arch, tile, "wgmma")
                if tile.warps % 4:
                    raise SpecError(f"wgmma is issued by warpgroups of 4 warps; Tile.warps={tile.warps} is not a multiple of 4")
            return "wgmma"
        if tile is not None:
            self.check_registers(arch, tile)
        return "mma.sync"


def elementwise_head(name: str, arch, doc: str, inp: str, out: str, count: str, warps: int, per_cta_key: str):
    """The prologue of the elementwise kernels (input pointer, output pointer, item count; one warp per item,
    `warps` items per CTA): → (builder, input, output, count)."""
    b = KernelBuilder(name, arch, doc, block=(32 * warps, 1, 1))
    i_p, o_p, n_p = b.param(inp, "u64", "ptr:in"), b.param(out, "u64", "ptr:out"), b.param(count, "u32", "scalar")
    b.meta.update({"warps": warps, per_cta_key: warps, "grid": f"ceil({count} / {warps})"})
    i, o = b.ptr(i_p), b.ptr(o_p)
    return b, i, o, b.ld_param(n_p, "u32")


def warp_sum(b: KernelBuilder, v: Reg, *, inplace: bool = False) -> Reg:
    """fp32 `v` summed over the warp by a butterfly (lane offsets 16, 8, 4, 2, 1: every lane ends with the same
    total, in the same order of additions): a new register per step, or `inplace` into `v`."""
    for off in (16, 8, 4, 2, 1):
        o = b.op("shfl.sync.bfly.b32", v, Imm(off, "u32"), Imm(31, "u32"), Imm(0xFFFFFFFF, "b32"), type="f32")
        if inplace:
            b.emit("add.rn.f32", v, v, o)
        else:
            v = b.op("add.rn.f32", v, o)
    return v


def warp_per_item(b: KernelBuilder, count: Reg, warps: int):
    """Schedule of the elementwise kernels: one warp per item (a quant block), `warps` items per CTA.
    Returns (lane, item, done); warps past `count` branch to `done`, which the caller places."""
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    item = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(warps, "u32"), b.op("shr.u32", tid, Imm(5, "u32")))
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", item, count))
    return lane, item, done


# ---------------------------------------------------------------------------------------------------
# dequant sequences: small ops over a register environment (a dict of named values)

@dataclass(frozen=True)
class DequantOp:
    def lower(self, b: KernelBuilder, env: dict) -> None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class LoadWords(DequantOp):
    """env[name] = `count` u32 words of the block at env[base] + offset (4-byte loads: GGUF rows are only
    4-byte aligned for Q4_K/Q5_K)."""
    name: str
    offset: int
    count: int
    base: str = "block"

    def lower(self, b, env):
        env[self.name] = [b.op("ld.global.nc.u32", Mem(env[self.base], self.offset + 4 * i)) for i in range(self.count)]


@dataclass(frozen=True)
class SplitHalves(DequantOp):
    """Word `index` of env[words] holds two fp16 fields → two f32 registers (Q4_K's d and dmin)."""
    words: str
    index: int
    names: tuple

    def lower(self, b, env):
        lo, hi = b.reg("b16"), b.reg("b16")
        b.emit("mov.b32", b.vec([lo, hi]), env[self.words][self.index])
        env[self.names[0]] = b.op("cvt.f32.f16", lo)
        env[self.names[1]] = b.op("cvt.f32.f16", hi)


@dataclass(frozen=True)
class _ScaleMin6(DequantOp):
    """The K-quants' 6-bit (sc, m) decodes: the 3 packed scale words env[words][first:first+3], the sub-block index
    env[sub], the names `out` they leave."""
    words: str
    first: int
    sub: str
    out: tuple

    def operands(self, b, env):
        """(s0, s1, s2, j, j < 4)."""
        s0, s1, s2 = env[self.words][self.first:self.first + 3]
        j = env[self.sub]
        return s0, s1, s2, j, b.op("setp.lt.u32", j, Imm(4, "u32"))


@dataclass(frozen=True)
class DecodeScaleMin6(_ScaleMin6):
    """Q4_K/Q5_K 6-bit (sc, m) of sub-block env[sub] from the 3 packed scale words env[words][first:first+3].
    Branchless: both branches of ggml's get_scale_min_k4 are extracted with `bfe` at a run-time bit position
    and `selp` picks one, so lanes working on different sub-blocks do not diverge."""

    def lower(self, b, env):
        s0, s1, s2, j, low = self.operands(b, env)
        pos = b.op("shl.b32", b.op("and.b32", j, Imm(3, "b32")), Imm(3, "u32"))
        a0, a1, a2 = (b.op("bfe.u32", s, pos, Imm(8, "u32")) for s in (s0, s1, s2))
        sc_lo = b.op("and.b32", a0, Imm(63, "b32"))  # j < 4: q[j] & 63
        m_lo = b.op("and.b32", a1, Imm(63, "b32"))  # q[j+4] & 63
        sc_hi = b.op("bfi.b32", b.op("shr.u32", a0, Imm(6, "u32")), b.op("and.b32", a2, Imm(15, "b32")),
                     Imm(4, "u32"), Imm(2, "u32"))  # (q[j+4] & 0xF) | (q[j-4] >> 6) << 4
        m_hi = b.op("bfi.b32", b.op("shr.u32", a1, Imm(6, "u32")), b.op("shr.u32", a2, Imm(4, "u32")),
                    Imm(4, "u32"), Imm(2, "u32"))  # (q[j+4] >> 4) | (q[j] >> 6) << 4
        env[self.out[0]] = b.op("selp.b32", sc_lo, sc_hi, low)
        env[self.out[1]] = b.op("selp.b32", m_lo, m_hi, low)


@dataclass(frozen=True)
class DecodeScaleMinPair6(_ScaleMin6):
    """Q4_K/Q5_K 6-bit (sc, m) of the sub-block pair env[sub], env[sub] + 1 (env[sub] even: the low and high
    nibbles of one 32-byte chunk), word-parallel: the four scale bytes of the header half the pair lies in are
    formed at once — j < 4: q[j] & 63 and q[j+4] & 63; j ≥ 4: (q[j+4] & 0xF) | (q[j-4] >> 6) << 4 and
    (q[j+4] >> 4) | (q[j] >> 6) << 4, byte j & 3 of each word either way — by masks chosen per lane (no
    divergence), and the pair shifted down to bytes 0 and 1. ~12 operations for both sub-blocks where two
    DecodeScaleMin6 take ~40. out: (sc of sub, m of sub, sc of sub + 1, m of sub + 1), u32."""

    def lower(self, b, env):
        s0, s1, s2, j, low = self.operands(b, env)
        keep = b.op("selp.b32", Imm(0x3F3F3F3F, "b32"), Imm(0x0F0F0F0F, "b32"), low)  # the bits from q[j(+4)]
        top = b.op("selp.b32", Imm(0, "b32"), Imm(0x30303030, "b32"), low)  # bits 4-5 from q[j(-4)] >> 6
        shift = b.op("shl.b32", b.op("and.b32", j, Imm(2, "b32")), Imm(3, "u32"))  # byte j & 3 (0 or 2) to byte 0
        sc = b.op("or.b32", b.op("and.b32", b.op("selp.b32", s0, s2, low), keep),
                  b.op("and.b32", b.op("shr.u32", s0, Imm(2, "u32")), top))
        m = b.op("or.b32", b.op("and.b32", b.op("selp.b32", s1, b.op("shr.u32", s2, Imm(4, "u32")), low), keep),
                 b.op("and.b32", b.op("shr.u32", s1, Imm(2, "u32")), top))
        sc, m = b.op("shr.u32", sc, shift), b.op("shr.u32", m, shift)
        for name, word, at in zip(self.out, (sc, m, sc, m), (0, 0, 8, 8)):
            env[name] = b.op("bfe.u32", word, Imm(at, "u32"), Imm(8, "u32"))


@dataclass(frozen=True)
class ScaleProduct(DequantOp):
    """env[out] = env[scale] · float(env[small_int]) in float32 (ggml forms d·sc and dmin·m first)."""
    scale: str
    small_int: str
    out: str

    def lower(self, b, env):
        env[self.out] = b.op("mul.rn.f32", env[self.scale], b.op("cvt.rn.f32.u32", env[self.small_int]))


@dataclass(frozen=True)
class UnpackNibbles(DequantOp):
    """One u32 of packed 4-bit values → the low nibbles of bytes 0..3 (env[out[0]]) and the high nibbles
    (env[out[1]]), each as 4 u32 registers (`bfe` per nibble)."""
    word: str
    out: tuple

    def lower(self, b, env):
        w = env[self.word]
        for half, name in enumerate(self.out):
            env[name] = [b.op("bfe.u32", w, Imm(8 * byte + 4 * half, "u32"), Imm(4, "u32")) for byte in range(4)]


@dataclass(frozen=True)
class ApplyScaleMin(DequantOp):
    """w = d1·q − m1 per value, float32, each op rounded on its own (`.rn` keeps ptxas from contracting to
    an FMA, so the result is bit-identical to ggml's dequantize_row_q4_K)."""
    values: str
    scale: str
    minimum: str
    out: str

    def lower(self, b, env):
        env[self.out] = [b.op("sub.rn.f32", b.op("mul.rn.f32", env[self.scale], b.op("cvt.rn.f32.u32", q)),
                              env[self.minimum]) for q in env[self.values]]


@dataclass(frozen=True)
class ConvertPacked(DequantOp):
    """float32 values → packed pairs (`to` = f16x2 or bf16x2, round to nearest even), element 2i low."""
    values: str
    out: str
    to: str = "f16x2"

    def __post_init__(self):
        if self.to not in ("f16x2", "bf16x2"):
            raise SpecError(f"ConvertPacked.to must be f16x2 or bf16x2, got {self.to!r}")

    @property
    def label(self) -> str:
        return "ConvertHalf" if self.to == "f16x2" else "ConvertBF16"

    def lower(self, b, env):
        vals = env[self.values]
        env[self.out] = [b.op(f"cvt.rn.{self.to}.f32", vals[i + 1], vals[i], type="b32") for i in range(0, len(vals), 2)]


def ConvertHalf(values: str, out: str) -> ConvertPacked:  # noqa: N802 - reads as the op it builds
    return ConvertPacked(values, out, "f16x2")


def ConvertBF16(values: str, out: str) -> ConvertPacked:  # noqa: N802
    return ConvertPacked(values, out, "bf16x2")


@dataclass(frozen=True)
class PackS8(DequantOp):
    """Small integers (u32 registers, e.g. 4-bit or 6-bit quants) → int8 fragments: 4 per 32-bit register,
    value i in byte i%4, each minus `offset` (8 for Q4_0-style centring, 0 to keep Q4_K's 0..15), saturated."""
    values: str
    out: str
    offset: int = 0

    def lower(self, b, env):
        vals = env[self.values]
        if len(vals) % 4:
            raise SpecError(f"PackS8 packs groups of 4 values, got {len(vals)}")
        out = []
        for i in range(0, len(vals), 4):
            acc = None
            for j in range(4):
                v = vals[i + j] if not self.offset else b.op("sub.s32", vals[i + j], Imm(self.offset, "s32"), type="s32")
                v = b.op("cvt.sat.s8.s32", v, type="b32")
                acc = b.op("and.b32", v, Imm(0xFF, "b32")) if acc is None else \
                    b.op("bfi.b32", v, acc, Imm(8 * j, "u32"), Imm(8, "u32"))
            out.append(acc)
        env[self.out] = out


@dataclass(frozen=True)
class Epilogue:
    """How an MMA accumulator tile leaves the kernel: fp32 stores of D fragments, optionally transposed
    (y[n][m] for y = x·Wᵀ computed as W·xᵀ), masked to the problem's M × N so partial tiles are safe."""

    out_dtype: str = "f32"
    transposed: bool = True
    row_group: int = 1  # > 1: the tile's A rows came by row_group loads of row_span rows each — tile row s holds weight
    # row m0 + (s % row_span)·row_group + s / row_span (kernels/mmq.py ROW_GROUP_NOTE)
    row_span: int = 0

    def __post_init__(self):
        if self.out_dtype != "f32":
            raise SpecError(f"Epilogue.out_dtype: only f32 is lowered, got {self.out_dtype!r}")
        if self.row_group > 1 and (self.row_span & (self.row_span - 1) or self.row_span < 1):
            raise SpecError(f"Epilogue.row_span: a power of two with row_group > 1, got {self.row_span}")

    def lower_mma_sync(self, b, acc, lane, m0, wm, warp_m: int, n0, wn, warp_n: int, M, N, Y, rows=None,
                       col_row=None):
        """acc[i][j][e] of m16n8 fragments of warp (wm, wn) in the CTA tile at (m0, n0) (fragment rows g, g+8;
        cols 2·tig, +1) → Y, masked to m < M, n < N (and with `rows`, a predicate per i, to the rows it holds).
        `col_row` (transposed only; mul_mat_id's scatter): column n is stored to Y's row col_row(n) instead of n,
        asked once per column a thread holds."""
        g = b.op("shr.u32", lane, Imm(2, "u32"))
        tig = b.op("and.b32", lane, Imm(3, "b32"))
        mb = b.op("add.u32", m0, b.op("mad.lo.u32", wm, Imm(warp_m, "u32"), g))
        nb = b.op("add.u32", n0, b.op("mad.lo.u32", wn, Imm(warp_n, "u32"), b.op("shl.b32", tig, Imm(1, "u32"))))
        if col_row is not None and not self.transposed:
            raise ValueError("lower_mma_sync: col_row maps columns to rows of a transposed (N x M) output")
        cols = {}  # column offset → (n, its mask, its Y row): one per column a thread holds
        grouped = {}  # (row_group > 1) row offset → the weight row it holds

        def row_at(c):
            if self.row_group == 1:
                return b.op("add.u32", mb, Imm(c, "u32"))
            if c not in grouped:
                loc = b.op("add.u32", b.op("mad.lo.u32", wm, Imm(warp_m, "u32"), g), Imm(c, "u32"))
                grouped[c] = b.op("add.u32", m0, b.op(
                    "mad.lo.u32", b.op("and.b32", loc, Imm(self.row_span - 1, "b32")), Imm(self.row_group, "u32"),
                    b.op("shr.u32", loc, Imm(self.row_span.bit_length() - 1, "u32"))))
            return grouped[c]
        for i, row in enumerate(acc):
            for j, frag in enumerate(row):
                for e, r in enumerate(frag):
                    mm = row_at(16 * i + 8 * (e // 2))
                    c = 8 * j + (e % 2)
                    if col_row is None:
                        nn = n_row = b.op("add.u32", nb, Imm(c, "u32"))
                        ok = b.op("and.pred", b.op("setp.lt.u32", mm, M), b.op("setp.lt.u32", nn, N))
                    else:
                        if c not in cols:
                            nn = b.op("add.u32", nb, Imm(c, "u32"))
                            cols[c] = (b.op("setp.lt.u32", nn, N), col_row(nn))
                        n_ok, n_row = cols[c]
                        ok = b.op("and.pred", b.op("setp.lt.u32", mm, M), n_ok)
                    if rows is not None:
                        ok = b.op("and.pred", ok, rows[i])
                    idx = b.op("mad.lo.u32", n_row, M, mm) if self.transposed else b.op("mad.lo.u32", mm, N, nn)
                    b.emit("st.global.f32", Mem(b.op("mad.wide.u32", idx, Imm(4, "u32"), Y)), r, pred=ok)


@dataclass(frozen=True)
class DequantSequence:
    """A named composition of dequant ops for one weight format; kernels append their own tail."""
    fmt: str
    ops: tuple

    def lower(self, b: KernelBuilder, env: dict) -> dict:
        b.comment(f"dequant {self.fmt}: " + " -> ".join(getattr(o, "label", type(o).__name__) for o in self.ops))
        for o in self.ops:
            o.lower(b, env)
        return env

    def then(self, *ops: DequantOp) -> "DequantSequence":
        return DequantSequence(self.fmt, self.ops + tuple(ops))
