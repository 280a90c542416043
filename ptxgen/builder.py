"""`KernelBuilder`: allocates typed registers, parameters, shared memory and labels, collects instructions,
and yields a `Kernel` record the emitter renders. Kernel descriptions and lowering code talk to this."""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

from . import ir
from .arch import Arch
from .ir import Imm, Instr, IRError, Label, Mem, Reg, Sym, Vec


@dataclass(frozen=True)
class Param:
    name: str
    ptx_type: str  # u64 (pointer), u32, s32, f32, or b8 with `array` bytes (a CUtensorMap is b8[128] align 64)
    array: int = 0
    align: int = 0
    role: str = ""  # what the runtime passes: "ptr:in", "ptr:out", "ptr:scratch", "scalar", "tensormap"

    @property
    def size(self) -> int:
        return self.array if self.array else ir.TYPE_BITS[self.ptx_type] // 8

    def abi(self) -> dict:
        return {"name": self.name, "type": self.ptx_type, "size": self.size, "align": self.align or self.size,
                "role": self.role}


@dataclass(frozen=True)
class Shared:
    name: str
    nbytes: int
    align: int = 16


@dataclass(frozen=True)
class Const:
    name: str
    data: tuple
    align: int = 4


@dataclass
class Kernel:
    name: str
    entry: str
    arch: Arch
    doc: str
    params: list
    block: tuple
    shared: list
    consts: list
    body: list
    reg_decls: list
    directives: list
    dynamic_smem: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def static_smem(self) -> int:
        return sum(s.nbytes for s in self.shared)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def ptx(self) -> str:
        from .emitter import render_module

        return render_module(self)

    def manifest(self, ptx_text: str) -> dict:
        return {
            "kernel": self.name,
            "arch": self.arch.name,
            "entry": self.entry,
            "params": [p.abi() for p in self.params],
            "block": list(self.block),
            "threads": self.threads,
            "static_smem": self.static_smem,
            "dynamic_smem": self.dynamic_smem,
            "meta": self.meta,
            "sha256": hashlib.sha256(ptx_text.encode()).hexdigest(),
        }


def _reg_class(t: str):
    if t == "pred":
        return ir.REG_CLASS["pred"]
    if t == "f32":
        return ir.REG_CLASS["f32"]
    return ir.REG_CLASS[ir.TYPE_BITS[t]]


class KernelBuilder:
    def __init__(self, name: str, arch: Arch, doc: str = "", block=(256, 1, 1), entry: str | None = None):
        self.name = name
        self.arch = arch
        self.doc = doc
        self.block = tuple(block)
        self.entry = entry or name
        self.params: list[Param] = []
        self.shared: list[Shared] = []
        self.consts: list[Const] = []
        self.body: list = []
        self.directives: list[str] = []
        self.meta: dict = {}
        self.dynamic_smem = 0
        self._counts: dict = {}
        self._labels = itertools.count()

    # --- declarations -------------------------------------------------------------------------------
    def param(self, name: str, ptx_type: str, role: str = "scalar", array: int = 0, align: int = 0) -> Sym:
        if any(p.name == name for p in self.params):
            raise IRError(f"{self.name}: parameter {name} declared twice")
        self.params.append(Param(name, ptx_type, array, align, role))
        return Sym(name)

    def shared_buffer(self, name: str, nbytes: int, align: int = 16) -> Sym:
        total = sum(s.nbytes for s in self.shared) + nbytes + self.dynamic_smem
        if total > self.arch.max_smem_per_block:
            raise IRError(f"{self.name}: {total} B of shared memory exceeds {self.arch.name}'s "
                          f"{self.arch.max_smem_per_block} B per block")
        self.shared.append(Shared(name, nbytes, align))
        return Sym(name)

    def dynamic_shared(self, nbytes: int) -> Sym:
        """Dynamic shared memory (`dsmem`), opted into at launch; may exceed 48 KB up to the arch's limit."""
        total = sum(s.nbytes for s in self.shared) + nbytes
        if total > self.arch.max_smem_per_block:
            raise IRError(f"{self.name}: {total} B of shared memory exceeds {self.arch.name}'s "
                          f"{self.arch.max_smem_per_block} B per block")
        self.dynamic_smem = nbytes
        return Sym("dsmem")

    def const_table(self, name: str, data: bytes, align: int = 4) -> Sym:
        self.consts.append(Const(name, tuple(data), align))
        return Sym(name)

    def reg(self, t: str) -> Reg:
        cls, prefix = _reg_class(t)
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return Reg(f"{prefix}{n}", t)

    def regs(self, t: str, n: int) -> list[Reg]:
        return [self.reg(t) for _ in range(n)]

    def label(self, hint: str) -> Label:
        return Label(f"$L_{hint}_{next(self._labels)}")

    # --- instructions -------------------------------------------------------------------------------
    # --- programmatic dependent launch (PDL) -------------------------------------------------------------
    def pdl_trigger(self) -> None:
        """`griddepcontrol.launch_dependents` where the target has it: a kernel launched behind this one with PDL
        may start (it waits, griddepcontrol.wait, before it reads what this one writes). Emitted first thing by the
        kernels that end an op, so the next op's first kernel (a `pdl_head`) is resident when this one ends."""
        if self.arch.has("griddepcontrol"):
            self.emit("griddepcontrol.launch_dependents")

    def pdl_head(self, trigger: bool = True) -> None:
        """Trigger, then `griddepcontrol.wait`, before anything else: this kernel touches no memory until every
        kernel before it in the stream has completed and flushed, so the runtime may launch it with PDL behind
        any kernel (meta `pdl_head`), hiding the launch gap between consecutive ops. `trigger=False`: the kernel
        calls pdl_trigger itself later (a trigger at the head lets the next ops' CTAs sit resident in its slots)."""
        if self.arch.has("griddepcontrol"):
            if trigger:
                self.pdl_trigger()
            self.emit("griddepcontrol.wait")
            self.meta["pdl_head"] = True

    def emit(self, opcode_or_instr, *operands, pred: Reg | None = None, neg: bool = False) -> Instr:
        i = opcode_or_instr if isinstance(opcode_or_instr, Instr) else Instr(opcode_or_instr, tuple(operands), pred, neg)
        if i.opcode in ("div.u32", "rem.u32") and isinstance(i.operands[2], Imm) and i.operands[2].value >= 1:
            return self._div_by_constant(i)
        return self._append(i)

    def _div_by_constant(self, i: Instr) -> Instr:
        """`div.u32` / `rem.u32` by an immediate as shifts and a multiply-high: ptxas (13.0) compiles them as a
        general division (I2F, MUFU.RCP, two IMAD.HI and fix-ups, ~12 SASS) even for 4; a ring-stage index
        costs that on every pipeline step. Returns the last instruction emitted."""
        d, a, c = i.operands[0], i.operands[1], int(i.operands[2].value)
        is_rem = i.opcode.startswith("rem")
        e = lambda op, *ops: self._append(Instr(op, ops, i.pred, i.pred_neg))  # noqa: E731
        if c & (c - 1) == 0:
            if is_rem:
                return e("and.b32", d, a, Imm(c - 1, "b32"))
            return e("shr.u32", d, a, Imm(c.bit_length() - 1, "u32"))
        q = d if not is_rem and d != a else self.reg("u32")
        magic, shift, add = ir.udiv_magic(c)
        if not add:  # q = mulhi(a, M) >> s
            e("mul.hi.u32", q, a, Imm(magic, "u32"))
            e("shr.u32", q, q, Imm(shift, "u32"))
        else:  # the 33-bit multiplier: t = mulhi(a, M - 2^32); q = (t + (a - t) / 2) >> (s - 1)
            t, u = self.reg("u32"), self.reg("u32")
            e("mul.hi.u32", t, a, Imm(magic, "u32"))
            e("sub.u32", u, a, t)
            e("shr.u32", u, u, Imm(1, "u32"))
            e("add.u32", u, u, t)
            e("shr.u32", q, u, Imm(shift - 1, "u32"))
        if not is_rem:
            return e("mov.u32", d, q) if q is not d else self.body[-1]
        return e("mad.lo.u32", d, q, Imm((1 << 32) - c, "u32"), a)  # a - q·c (mod 2^32)

    def _append(self, i: Instr) -> Instr:
        ir.check_feature(self.arch, i)
        self.body.append(i)
        return i

    def op(self, opcode: str, *srcs, type: str | None = None, pred: Reg | None = None) -> Reg:
        """Emit `opcode dst, srcs...` into a fresh register typed by the opcode's suffix (or `type`)."""
        t = type
        if t is None:
            base = opcode.split(".")[0]
            t = "pred" if base == "setp" else opcode.split(".")[-2] if base == "cvt" else ir._suffix_type(opcode)
            if ".wide." in opcode and t is not None:
                t = {"u32": "u64", "s32": "s64", "u16": "u32", "s16": "s32"}[t]
        if t is None:
            raise IRError(f"{opcode}: cannot infer the destination type; pass type=")
        d = self.reg(t)
        self.emit(opcode, d, *srcs, pred=pred)
        return d

    def place(self, label: Label) -> None:
        self.body.append(label)

    def comment(self, text: str) -> None:
        self.body.append(text)

    def special(self, name: str) -> Reg:
        """%tid.x, %ctaid.x, %laneid, ... into a u32 register."""
        r = self.reg("u32")
        self.emit("mov.u32", r, Sym(f"%{name}"))
        return r

    def ld_param(self, sym: Sym, t: str) -> Reg:
        r = self.reg(t)
        self.emit(f"ld.param.{t}", r, Mem(sym))
        return r

    def ptr(self, sym: Sym) -> Reg:
        """A pointer parameter as a global address."""
        p = self.ld_param(sym, "u64")
        return self.op("cvta.to.global.u64", p)

    def imm(self, v, t="u32") -> Imm:
        return Imm(v, t)

    def bra(self, target: Label, pred: Reg | None = None, neg: bool = False, uniform: bool = True) -> None:
        self.emit("bra.uni" if uniform else "bra", target, pred=pred, neg=neg)

    def vec(self, regs) -> Vec:
        return Vec(tuple(regs))

    # --- finishing ----------------------------------------------------------------------------------
    def finish(self) -> Kernel:
        if not self.body or not (isinstance(self.body[-1], Instr) and self.body[-1].opcode in ("ret", "exit")):
            self.emit("ret")
        order = {"%p": ("pred", 0), "%h": ("b16", 1), "%r": ("b32", 2), "%f": ("f32", 3), "%rd": ("b64", 4)}
        decls = sorted(((order[p][0], p, n) for p, n in self._counts.items()), key=lambda d: order[d[1]][1])
        return Kernel(self.name, self.entry, self.arch, self.doc, list(self.params), self.block, list(self.shared),
                      list(self.consts), list(self.body), decls, list(self.directives), self.dynamic_smem,
                      dict(self.meta))
