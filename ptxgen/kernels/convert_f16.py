"""convert_f16: fp32 activations → fp16 (round to nearest even), 8 values per thread, with an overflow flag.

The wgmma MMQ reads its activation tiles with TMA straight into swizzled shared memory, so the fp32 → fp16
conversion happens once per call here instead of once per weight-row tile inside the GEMM. Any value that
becomes ±inf or NaN in fp16 (|x| > 65504, or a NaN/inf input) sets `flag` to 1; `mul_mat` then answers
from the exact fp32 path instead of returning a wrong result.
"""
from __future__ import annotations

from ..builder import KernelBuilder
from ..ir import Imm, Mem
from ..layouts import q4k_rega_k_order
from . import KernelDef

THREADS = 256
PER_THREAD = 8


def build(arch, permuted: bool = False, gather: bool = False):
    """permuted (convert_f16_perm, for the register-A wgmma MMQ): within each 64-column chunk, output position L
    holds input column layouts.q4k_rega_k_order()[L] — for output group q = L / 8 (8 values, one 16-byte store)
    the inputs are base(q) plus 8 offsets shared by every q (order[0:8]), base(q) = order[8q] = (q & 1) +
    4·(q >> 1 & 1) + 32·(q >> 2), computed in the kernel (K a multiple of 64, so a chunk never straddles rows).
    gather (convert_f16_perm_gather, mul_mat_id's grouped wgmma GEMM; permuted too): _build_gather."""
    assert permuted or not gather
    if gather:
        return _build_gather(arch)
    name = "convert_f16_perm" if permuted else "convert_f16"
    doc = __doc__.splitlines()[0] + (" (K order of the register-A wgmma MMQ)" if permuted else "")
    b = KernelBuilder(name, arch, doc, block=(THREADS, 1, 1))
    x_p, y_p, f_p = b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out"), b.param("flag", "u64", "ptr:out")
    n_p = b.param("n8", "u32")  # number of 8-value groups
    b.meta.update(values_per_thread=PER_THREAD, grid=f"ceil(n8 / {THREADS})")
    if permuted:
        b.meta.update(k_order="layouts.q4k_rega_k_order() within each 64-column chunk")
    b.pdl_head()  # the wgmma MMQ after it may launch now (it waits before its first TMA of x)
    X, Y, F = b.ptr(x_p), b.ptr(y_p), b.ptr(f_p)
    n8 = b.ld_param(n_p, "u32")
    i = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(THREADS, "u32"), b.special("tid.x"))
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", i, n8), uniform=False)
    v = b.regs("f32", 8)
    if permuted:
        q = b.op("and.b32", i, Imm(7, "b32"))
        base = b.op("add.u32", b.op("and.b32", q, Imm(1, "b32")),  # (q & 1) + 4·(q >> 1 & 1) + 32·(q >> 2)
                    b.op("add.u32", b.op("shl.b32", b.op("and.b32", q, Imm(2, "b32")), Imm(1, "u32")),
                         b.op("shl.b32", b.op("shr.u32", q, Imm(2, "u32")), Imm(5, "u32"))))
        col = b.op("add.u32", b.op("shl.b32", b.op("and.b32", i, Imm(~7 & 0xFFFFFFFF, "b32")), Imm(3, "u32")),
                   base)  # the chunk's first element, 64·(i / 8), plus base(q)
        src = b.op("mad.wide.u32", col, Imm(4, "u32"), X)
        order = q4k_rega_k_order()
        # output group q's inputs: base(q) = order[8q] plus the same 8 offsets for every q (checked here)
        offs = [int(o - order[0]) for o in order[:8]]
        assert all(list(order[8 * q:8 * q + 8] - order[8 * q]) == offs for q in range(8))
        assert [int(order[8 * q]) for q in range(8)] == [(q & 1) + 4 * (q >> 1 & 1) + 32 * (q >> 2) for q in range(8)]
        for e, off in enumerate(offs):
            b.emit("ld.global.nc.f32", v[e], Mem(src, 4 * off))
    else:
        src = b.op("mad.wide.u32", i, Imm(32, "u32"), X)
        b.emit("ld.global.nc.v4.f32", b.vec(v[0:4]), Mem(src))
        b.emit("ld.global.nc.v4.f32", b.vec(v[4:8]), Mem(src, 16))
    h = [b.op("cvt.rn.f16x2.f32", v[2 * j + 1], v[2 * j], type="b32") for j in range(4)]
    b.emit("st.global.v4.b32", Mem(b.op("mad.wide.u32", i, Imm(16, "u32"), Y)), b.vec(h))
    b.emit("st.global.u32", Mem(F), Imm(1, "u32"), pred=_overflow(b, h))
    b.place(done)
    b.emit("ret")
    return b.finish()


def _overflow(b, words, over=None):
    """Whether a half of `words` (f16x2) is inf or NaN (its exponent bits all ones), or-ed into `over`."""
    for w in words:
        for mask in (0x7C00, 0x7C000000):
            p = b.op("setp.eq.u32", b.op("and.b32", w, Imm(mask, "b32")), Imm(mask, "u32"))
            over = p if over is None else b.op("or.pred", over, p)
    return over


GATHER_WARPS = 8  # output rows a CTA of convert_f16_perm_gather (a warp each)
GATHER_UNROLL = 4  # groups a lane converts per round: 8 16-byte loads in flight


def _build_gather(arch):
    """convert_f16_perm_gather: output row n < offsets[experts] (k8 groups of 8 columns) is input row order[n] /
    slots where the slots share x (per_slot 0), else order[n] — x in moe_group's grouped order, each 64-column
    chunk in layouts.q4k_rega_k_order. A warp a row: the row's order entry is read once, then lane l converts
    groups l + 32u, GATHER_UNROLL of them a round with their two 16-byte loads each issued together (a thread a
    group, the earlier form, waited on offsets, order and x in a row for every 8 columns: 13.6 µs at T = 512, 128
    experts top-8, for 16.8 MB written; bench/NOTES.md, 2026-12-03). Input group r = 8c + 4h + j holds word j of
    output groups 8c + 4h + q' (q' = 0..3): the halves of input columns b' and b' + 2 of the group, b' = (q' & 1)
    + 4·(q' >> 1) (checked below); each lane stores one 4-byte word into each of 4 output groups. Rows from
    offsets[experts] on (the pairs with a bad id, which order does not hold) are left as they are: only columns the
    GEMM's epilogue masks read them. The flag word is the route's gate."""
    b = KernelBuilder("convert_f16_perm_gather", arch, __doc__.splitlines()[0] + " (K order of the register-A wgmma "
                      "MMQ), rows gathered in moe_group's order", block=(32 * GATHER_WARPS, 1, 1))
    x_p, y_p, f_p = b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out"), b.param("flag", "u64", "ptr:out")
    n_p = b.param("n8", "u32")  # number of 8-value groups (rows x k8)
    o_p, off_p = b.param("order", "u64", "ptr:in"), b.param("offsets", "u64", "ptr:in")
    e_p, k8_p = b.param("experts", "u32"), b.param("k8", "u32")  # groups of 8 per row (a multiple of 32)
    sl_p, ps_p = b.param("slots", "u32"), b.param("per_slot", "u32")
    b.meta.update(grid=f"ceil(n8 / k8 / {GATHER_WARPS})", rows_per_cta=GATHER_WARPS,
                  k_order="layouts.q4k_rega_k_order() within each 64-column chunk",
                  rows="output row n < offsets[experts] = x row order[n] / slots (x shared by the slots) or "
                       "order[n] (per slot); rows past it untouched")
    b.pdl_head()  # the wgmma MMQ after it may launch now (it waits before its first TMA of x)
    X, Y, F = b.ptr(x_p), b.ptr(y_p), b.ptr(f_p)
    tid = b.special("tid.x")
    lane = b.op("and.b32", tid, Imm(31, "b32"))
    n = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(GATHER_WARPS, "u32"), b.op("shr.u32", tid, Imm(5, "u32")))
    k8 = b.ld_param(k8_p, "u32")
    done = b.label("done")
    valid = b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", b.ld_param(e_p, "u32"), Imm(4, "u32"), b.ptr(off_p))))
    b.bra(done, pred=b.op("setp.ge.u32", n, valid), uniform=False)
    pair = b.op("ld.global.nc.u32", Mem(b.op("mad.wide.u32", n, Imm(4, "u32"), b.ptr(o_p))))
    shared = b.op("setp.eq.u32", b.ld_param(ps_p, "u32"), Imm(0, "u32"))
    row = b.op("selp.b32", b.op("div.u32", pair, b.ld_param(sl_p, "u32")), pair, shared, type="b32")
    src = b.op("mad.wide.u32", b.op("mad.lo.u32", row, k8, lane), Imm(32, "u32"), X)  # group lane of the row
    # output word lane & 3 of output groups (n·k8 + lane) & ~3 + q'
    dst = b.op("mad.wide.u32", b.op("mad.lo.u32", n, k8, b.op("and.b32", lane, Imm(~3 & 0xFFFFFFFF, "b32"))),
               Imm(16, "u32"), b.op("mad.wide.u32", b.op("and.b32", lane, Imm(3, "b32")), Imm(4, "u32"), Y))
    order = q4k_rega_k_order()
    assert all(int(order[8 * (4 * hh + q) + 2 * j + e]) == 32 * hh + 8 * j + (q & 1) + 4 * (q >> 1) + 2 * e
               for hh in range(2) for q in range(4) for j in range(4) for e in range(2))
    r = b.op("mov.u32", lane)
    over = b.op("setp.ne.u32", lane, lane)  # false
    vs = [b.regs("f32", 8) for _ in range(GATHER_UNROLL)]
    for v in vs[1:]:  # a round past k8 leaves them unloaded (its stores are predicated off): zero, not undefined
        for x in v:
            b.emit("mov.f32", x, Imm(0.0, "f32"))
    top, out = b.label("groups"), b.label("groups_end")
    b.place(top)
    b.bra(out, pred=b.op("setp.ge.u32", r, k8), uniform=False)
    got = []
    for u in range(GATHER_UNROLL):
        inb = b.op("setp.lt.u32", b.op("add.u32", r, Imm(32 * u, "u32")), k8)
        v = vs[u]
        b.emit("ld.global.nc.v4.f32", b.vec(v[0:4]), Mem(src, 1024 * u), pred=inb)
        b.emit("ld.global.nc.v4.f32", b.vec(v[4:8]), Mem(src, 1024 * u + 16), pred=inb)
        got.append((inb, v))
    for u, (inb, v) in enumerate(got):
        h = [b.op("cvt.rn.f16x2.f32", v[(q & 1) + 4 * (q >> 1) + 2], v[(q & 1) + 4 * (q >> 1)], type="b32")
             for q in range(4)]
        for q in range(4):
            b.emit("st.global.b32", Mem(dst, 512 * u + 16 * q), h[q], pred=inb)
        b.emit("or.pred", over, over, b.op("and.pred", inb, _overflow(b, h)))
    b.emit("add.u32", r, r, Imm(32 * GATHER_UNROLL, "u32"))
    b.emit("add.u64", src, src, Imm(1024 * GATHER_UNROLL, "u64"))
    b.emit("add.u64", dst, dst, Imm(512 * GATHER_UNROLL, "u64"))
    b.bra(top, uniform=False)
    b.place(out)
    b.emit("st.global.u32", Mem(F), Imm(1, "u32"), pred=over)
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNEL = KernelDef("convert_f16", "fp32 → fp16 activations with an overflow flag", build)
KERNEL_PERM = KernelDef("convert_f16_perm", "fp32 → fp16 activations in the register-A wgmma MMQ's K order, with "
                        "an overflow flag", lambda arch: build(arch, permuted=True), archs=("sm_90a",))
KERNEL_GATHER = KernelDef("convert_f16_perm_gather", "fp32 → fp16 activations in the register-A wgmma MMQ's K order, "
                          "rows gathered in moe_group's order (mul_mat_id), with an overflow flag",
                          lambda arch: build(arch, permuted=True, gather=True), archs=("sm_90a",))
