"""PTX instructions as frozen dataclasses that validate themselves at construction.

Operands are `Reg` (typed virtual register), `Imm` (typed immediate), `Sym` (parameter, shared
variable), `Mem` (an address expression `[base+offset]`), `Vec` (a `{...}` register list) and `Label`.
Nothing here renders text: `ptxgen.emitter` does that, for every instruction, in one place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .arch import Arch, ArchError

# width in bits of every PTX type ptxgen uses
TYPE_BITS = {
    "pred": 1,
    "b8": 8, "u8": 8, "s8": 8,
    "b16": 16, "u16": 16, "s16": 16, "f16": 16, "bf16": 16,
    "b32": 32, "u32": 32, "s32": 32, "f32": 32, "f16x2": 32, "bf16x2": 32,
    "b64": 64, "u64": 64, "s64": 64, "f64": 64,
}
# register classes: the declared type and name prefix per width/kind
REG_CLASS = {"pred": ("pred", "%p"), 16: ("b16", "%h"), 32: ("b32", "%r"), 64: ("b64", "%rd"), "f32": ("f32", "%f")}


class IRError(ValueError):
    """An instruction was built with operands PTX would reject."""


@dataclass(frozen=True)
class Reg:
    name: str
    type: str

    def __post_init__(self):
        if self.type not in TYPE_BITS:
            raise IRError(f"register {self.name}: unknown type {self.type!r}; known: {', '.join(TYPE_BITS)}")

    @property
    def bits(self) -> int:
        return TYPE_BITS[self.type]


@dataclass(frozen=True)
class Imm:
    value: Union[int, float]
    type: str = "s32"

    def __post_init__(self):
        if self.type not in TYPE_BITS:
            raise IRError(f"immediate {self.value}: unknown type {self.type!r}")
        if self.type.startswith(("u", "b")) and isinstance(self.value, int) and self.value < 0:
            raise IRError(f"immediate {self.value} is negative but typed {self.type}")


@dataclass(frozen=True)
class Sym:
    """A named address: a kernel parameter or a shared-memory variable."""
    name: str


@dataclass(frozen=True)
class Label:
    name: str


@dataclass(frozen=True)
class Mem:
    base: Union[Reg, Sym]
    offset: int = 0

    def __post_init__(self):
        if isinstance(self.base, Reg) and self.base.bits not in (32, 64):
            raise IRError(f"address register {self.base.name} must be 32 or 64 bits, is {self.base.type}")


@dataclass(frozen=True)
class Vec:
    regs: tuple

    def __post_init__(self):
        if not self.regs:
            raise IRError("an empty register vector")


@dataclass(frozen=True)
class TensorRef:
    """`[tmap, {c0, c1, ...}]`: a tensor map's generic address and the box's coordinates (TMA operand)."""
    tmap: Reg
    coords: tuple

    def __post_init__(self):
        if self.tmap.bits != 64:
            raise IRError(f"tensor map address {self.tmap.name} must be 64-bit, is .{self.tmap.type}")
        if not 1 <= len(self.coords) <= 5 or any(getattr(c, "bits", 32) != 32 for c in self.coords):
            raise IRError(f"TMA coordinates are 1 to 5 32-bit values, got {self.coords}")


Operand = Union[Reg, Imm, Sym, Label, Mem, Vec, TensorRef]

# base opcode → number of operands (destination first). None: checked by a dedicated class.
ARITY = {
    "mov": 2, "rem": 3, "add": 3, "sub": 3, "mul": 3, "mad": 4, "fma": 4, "div": 3, "rcp": 2, "sqrt": 2, "min": 3, "max": 3,
    "abs": 2, "neg": 2, "and": 3, "or": 3, "xor": 3, "not": 2, "shl": 3, "shr": 3, "shf": 4, "lop3": 5,
    "prmt": 4, "bfe": 4, "bfi": 5, "cvt": 2, "cvta": 2, "setp": 3, "selp": 4, "ld": 2, "st": 2, "atom": 3,
    "shfl": 5, "bar": 1, "bra": 1, "ret": 0, "exit": 0, "mma": 4, "ldmatrix": 2, "cp": 3, "cvt.pack": 3,
    "membar": 0, "fence": 0, "nanosleep": 1, "mbarrier": None, "wgmma": None, "setmaxnreg": 1, "red": 2, "dp4a": 4,
    "popc": 2, "clz": 2, "brev": 2, "ex2": 2, "lg2": 2, "vote": 3, "activemask": 1, "griddepcontrol": 0,
    "barrier": 0, "mapa": 3, "prefetch": 1,
}
# ops whose register operands all have the width of the opcode's type suffix
_SAME_WIDTH = {"add", "sub", "min", "max", "and", "or", "xor", "not", "neg", "abs", "div", "rcp", "sqrt", "selp"}
_TYPES_IN_ORDER = sorted(TYPE_BITS, key=len, reverse=True)


def _suffix_type(opcode: str) -> str | None:
    for part in reversed(opcode.split(".")):
        if part in TYPE_BITS:
            return part
    return None


@dataclass(frozen=True)
class Instr:
    """One PTX instruction: dotted opcode, operands (destination first), optional guard predicate."""

    opcode: str
    operands: tuple = ()
    pred: Reg | None = None
    pred_neg: bool = False

    def __post_init__(self):
        base = self.opcode.split(".")[0]
        if base not in ARITY:
            raise IRError(f"unknown opcode {self.opcode!r}; ptxgen knows: {', '.join(sorted(ARITY))}")
        n = ARITY[base]
        if n is not None and base not in ("cp", "ld", "st", "cvt", "shfl", "bar", "fence", "atom", "mma"):
            if len(self.operands) != n:
                raise IRError(f"{self.opcode} takes {n} operands, got {len(self.operands)}: {self.operands}")
        if self.pred is not None and self.pred.type != "pred":
            raise IRError(f"guard {self.pred.name} of {self.opcode} must be a .pred register, is .{self.pred.type}")
        t = _suffix_type(self.opcode)
        if base in _SAME_WIDTH and t is not None:
            regs = [o for o in self.operands if isinstance(o, Reg)]
            if base == "selp":
                regs = regs[:-1] if regs and regs[-1].type == "pred" else regs
            for r in regs:
                if r.bits != TYPE_BITS[t]:
                    raise IRError(f"{self.opcode}: operand {r.name} is .{r.type} ({r.bits} bits), "
                                  f"the instruction works on .{t} ({TYPE_BITS[t]} bits)")
        if base == "setp" and not (isinstance(self.operands[0], Reg) and self.operands[0].type == "pred"):
            raise IRError(f"{self.opcode}: destination must be a .pred register")
        if base == "prmt":
            mode = [p for p in self.opcode.split(".")[1:] if p in ("f4e", "b4e", "rc8", "ecl", "ecr", "rc16")]
            sel = self.operands[3]
            if not mode and isinstance(sel, Imm) and sel.value & 0x8888:
                raise IRError(
                    f"{self.opcode}: selector {sel.value:#06x} has bit 3 set in a nibble, which means "
                    "sign-replicate in PTX (CUDA's __byte_perm masks it away). Mask it with 0x7777, or "
                    "build it with ptxgen.layouts.prmt_selector(..., sign=...) if that is what you want.")


# ---------------------------------------------------------------------------------------------------
# instructions whose shape depends on more than an operand count

MMA_SHAPES = {
    # (shape, a/b type) → (accumulator type, #A regs, #B regs, #C regs, feature)
    ("m16n8k16", "f16"): ("f32", 4, 2, 4, "mma_sync_f16"),
    ("m16n8k16", "bf16"): ("f32", 4, 2, 4, "mma_sync_f16"),
    ("m16n8k16", "s8"): ("s32", 2, 1, 4, "mma_sync_s8"),
    ("m16n8k16", "u8"): ("s32", 2, 1, 4, "mma_sync_s8"),
    ("m16n8k32", "s8"): ("s32", 4, 2, 4, "mma_sync_s8"),
    ("m16n8k32", "u8"): ("s32", 4, 2, 4, "mma_sync_s8"),
}


def mma_sync(arch: Arch, shape: str, ab_type: str, d: Vec, a: Vec, b: Vec, c: Vec, b_type: str | None = None) -> Instr:
    """`mma.sync.aligned.<shape>.row.col.<acc>.<a>.<b>.<acc>`, checked against the legal table and the arch.
    `b_type` differs from `ab_type` only for the mixed-sign integer forms (u8 x s8, s8 x u8)."""
    b_type = b_type or ab_type
    key = (shape, ab_type)
    if key not in MMA_SHAPES or (shape, b_type) not in MMA_SHAPES:
        legal = ", ".join(f"{s} {t}" for s, t in MMA_SHAPES)
        raise IRError(f"mma.sync {shape} {ab_type} x {b_type} is not supported; legal: {legal}")
    if b_type != ab_type and {ab_type, b_type} != {"u8", "s8"}:
        raise IRError(f"mma.sync mixes types only as u8 x s8 or s8 x u8, got {ab_type} x {b_type}")
    acc, na, nb, nc, feat = MMA_SHAPES[key]
    arch.require(feat, f"mma.sync {shape} {ab_type}")
    for name, v, n in (("D", d, nc), ("A", a, na), ("B", b, nb), ("C", c, nc)):
        if len(v.regs) != n:
            raise IRError(f"mma.sync {shape} {ab_type}: {name} takes {n} registers, got {len(v.regs)}")
    for r in d.regs + c.regs:
        if r.bits != 32:
            raise IRError(f"mma.sync accumulators are 32-bit .{acc}, {r.name} is .{r.type}")
    sat = ".satfinite" if acc == "s32" else ""
    op = f"mma.sync.aligned.{shape}.row.col{sat}.{acc}.{ab_type}.{b_type}.{acc}"
    return Instr(op, (d, a, b, c))


WGMMA_N = tuple(range(8, 257, 8))


def wgmma(arch: Arch, n: int, ab_type: str, acc: Vec, a_desc_or_regs, b_desc: Reg, scale_d: int = 1,
          trans_a: int = 0, trans_b: int = 0) -> Instr:
    """`wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16` (A from a descriptor or registers). trans 0 is
    K-major (A rows and B columns contiguous along K), 1 is M/N-major; the register-A form has no trans_a."""
    arch.require("wgmma", "wgmma", "use mma.sync (m16n8k16 / m16n8k32) on this target, as the sm_120a lowering does")
    if n not in WGMMA_N:
        raise IRError(f"wgmma N={n} is not legal; N is a multiple of 8 from 8 to 256")
    k = {"f16": 16, "bf16": 16, "s8": 32}.get(ab_type)
    if k is None:
        raise IRError(f"wgmma {ab_type}: ptxgen supports f16, bf16 (k16) and s8 (k32)")
    if len(acc.regs) != n // 2:
        raise IRError(f"wgmma m64n{n}k{k}: the accumulator has {n // 2} registers per thread, got {len(acc.regs)}")
    if isinstance(a_desc_or_regs, Vec) and len(a_desc_or_regs.regs) != 4:
        raise IRError(f"wgmma with A from registers takes 4 32-bit registers, got {len(a_desc_or_regs.regs)}")
    if trans_a not in (0, 1) or trans_b not in (0, 1):
        raise IRError(f"wgmma transpose flags are 0 or 1, got {trans_a}, {trans_b}")
    acc_t = "s32" if ab_type == "s8" else "f32"
    ops = (acc, a_desc_or_regs, b_desc, Imm(scale_d, "s32"))
    if ab_type != "s8":
        ops += (Imm(1, "s32"), Imm(1, "s32"))
        if isinstance(a_desc_or_regs, Reg):
            ops += (Imm(trans_a, "s32"),)
        ops += (Imm(trans_b, "s32"),)
    return Instr(f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{acc_t}.{ab_type}.{ab_type}", ops)


def ldmatrix(arch: Arch, num: int, dst: Vec, addr: Mem, trans: bool = False) -> Instr:
    arch.require("ldmatrix", "ldmatrix")
    if num not in (1, 2, 4):
        raise IRError(f"ldmatrix .x{num}: legal counts are x1, x2, x4")
    if len(dst.regs) != num or any(r.bits != 32 for r in dst.regs):
        raise IRError(f"ldmatrix .x{num} writes {num} 32-bit registers, got {dst.regs}")
    return Instr(f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16", (dst, addr))


def cp_async(arch: Arch, dst: Mem, src: Mem, nbytes: int, src_bytes: Reg | None = None) -> Instr:
    arch.require("cp_async", "cp.async", "load with ld.global and st.shared instead")
    if nbytes not in (4, 8, 16):
        raise IRError(f"cp.async copies 4, 8 or 16 bytes, not {nbytes}")
    kind = "cg" if nbytes == 16 else "ca"
    ops = (dst, src, Imm(nbytes, "u32")) + ((src_bytes,) if src_bytes is not None else ())
    return Instr(f"cp.async.{kind}.shared.global", ops)


def udiv_magic(c: int) -> tuple[int, int, bool]:
    """Division of any u32 by the constant c ≥ 2 (not a power of two) as a multiply-high: (M, s, False) with
    floor(a / c) = mulhi(a, M) >> s for every u32 a (Granlund–Montgomery: 2^(32+s) ≤ M·c ≤ 2^(32+s) + 2^s), or,
    where no 32-bit M exists (c = 7), (M, l, True) with t = mulhi(a, M), floor(a / c) = (t + (a − t) / 2) >> (l − 1)."""
    if c < 2 or c & (c - 1) == 0 or c >= 1 << 32:
        raise IRError(f"udiv_magic: {c} is not a u32 divisor that needs a multiplier")
    for s in range(32):
        m = -(-(1 << (32 + s)) // c)
        if m < 1 << 32 and m * c - (1 << (32 + s)) <= 1 << s:
            return m, s, False
    ell = (c - 1).bit_length()
    return ((1 << 32) * ((1 << ell) - c)) // c + 1, ell, True


def check_feature(arch: Arch, instr: Instr) -> None:
    """Arch checks for instructions built through the generic `Instr` constructor."""
    op = instr.opcode
    needs = [("cp.async.bulk", "cp_async_bulk_tensor"),  # (every bulk form, tensor or plain, copy or prefetch: TMA's)
             ("cp.async", "cp_async"), ("wgmma", "wgmma"),
             ("ldmatrix", "ldmatrix"), ("stmatrix", "stmatrix"), ("setmaxnreg", "setmaxnreg"),
             ("mbarrier.try_wait", "mbarrier_try_wait"), ("mbarrier.expect_tx", "mbarrier_expect_tx"),
             ("mbarrier.arrive.expect_tx", "mbarrier_expect_tx"), ("griddepcontrol", "griddepcontrol"),
             ("mapa", "clusters"), ("barrier.cluster", "clusters"), ("fence.mbarrier_init", "clusters")]
    for prefix, feat in needs:
        if op.startswith(prefix):
            if not arch.has(feat):
                raise ArchError(f"{op} needs {feat}, which {arch.name} does not have")
            return
