"""convert_f16: fp32 activations → fp16 (round to nearest even), 8 values per thread, with an overflow flag.

The wgmma MMQ reads its activation tiles with TMA straight into swizzled shared memory, so the fp32 → fp16
conversion happens once per call here instead of once per weight-row tile inside the GEMM. Any value that
becomes ±inf or NaN in fp16 (|x| > 65504, or a NaN/inf input) sets `flag` to 1, as does a group of 8 values all
under 2^-11 and not all zero (too_small: a token too small for fp16's precision); `mul_mat` then answers those
tokens from the exact fp32 path (the fixup) instead of returning a wrong result.
"""
from __future__ import annotations

from ..builder import KernelBuilder
from ..ir import Imm, Mem
from ..layouts import q4k_rega_k_order
from . import KernelDef
from ..specs import ActKernel

THREADS = 256
PER_THREAD = 8


def build(arch, permuted: bool = False):
    """permuted (convert_f16_perm, for the register-A wgmma MMQ): within each 64-column chunk, output position L
    holds input column layouts.q4k_rega_k_order()[L]. A thread loads input group i (8 consecutive columns, two
    16-byte loads) and stores output group i after its quad's transpose (rega_halves, rega_words, rega_store, as
    moe_gather does; K a multiple of 64, so a chunk never straddles rows).
    (mul_mat_id's gathered form of it is moe_group.py's moe_gather.)"""
    name = ActKernel("convert_f16", rega=permuted).name
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
    src = b.op("mad.wide.u32", i, Imm(32, "u32"), X)
    b.emit("ld.global.nc.v4.f32", b.vec(v[0:4]), Mem(src))
    b.emit("ld.global.nc.v4.f32", b.vec(v[4:8]), Mem(src, 16))
    if permuted:  # input group i as it lies, its words into place by the quad
        h = rega_halves(b, v)
        _rega_stores(b, h, i, Y)
    else:
        h = [b.op("cvt.rn.f16x2.f32", v[2 * j + 1], v[2 * j], type="b32") for j in range(4)]
        rega_store(b, h, i, Y)
    b.emit("st.global.u32", Mem(F), Imm(1, "u32"), pred=conversion_flag(b, v))
    b.place(done)
    b.emit("ret")
    return b.finish()


def rega_halves(b, v):
    """The 8 fp32 values `v` of an input group as the 4 fp16x2 words the register-A K order scatters: word q holds
    the halves of input columns b' and b' + 2, b' = (q & 1) + 4·(q >> 1)."""
    # input group r = 8c + 4h + j holds word j of output groups 8c + 4h + q' (q' = 0..3): the halves of input
    # columns b' and b' + 2 of the group (layouts.q4k_rega_k_order, checked here)
    order = q4k_rega_k_order()
    assert all(int(order[8 * (4 * hh + q) + 2 * j + e]) == 32 * hh + 8 * j + (q & 1) + 4 * (q >> 1) + 2 * e
               for hh in range(2) for q in range(4) for j in range(4) for e in range(2))
    return [b.op("cvt.rn.f16x2.f32", v[(q & 1) + 4 * (q >> 1) + 2], v[(q & 1) + 4 * (q >> 1)], type="b32")
            for q in range(4)]


def rega_words(b, h):
    """What a thread stores of its input group's words `h` (rega_halves): output group i whole after its quad's
    transpose. Made once, stored at several places by rega_store (moe_gather: a token's row at each of its slots'
    places)."""
    return _quad_transpose(b, h)


def rega_store(b, words, i, Y):
    """rega_words' `words` of input group i into the output whose flat group index is i (one 16-byte store)."""
    b.emit("st.global.v4.b32", Mem(b.op("mad.wide.u32", i, Imm(16, "u32"), Y)), b.vec(words))


def _rega_stores(b, h, i, Y):
    """Input group i's four words h[q] (the halves of its columns b', b' + 2, b' = (q & 1) + 4·(q >> 1)) to word
    i % 4 of output groups 4·(i / 4) + q: the register-A K order (layouts.q4k_rega_k_order). The four threads of a
    quad (input groups 4·(i / 4) + j, lane j = i % 4, all present: K / 8 is a multiple of 8) hold a 4 x 4 matrix of
    words whose transpose is their four output groups: after it (_quad_transpose) thread j stores output group i
    whole — a warp's 32 stores one 512-byte run, where the 4 scattered word stores wrote each 32-byte sector in
    halves, 8 sectors an instruction."""
    rega_store(b, rega_words(b, h), i, Y)


def _quad_transpose(b, h):
    """The 4 x 4 word matrix a quad holds (lane j = tid % 4: row j, h) transposed (lane j: column j), by two
    exchanges: the off-diagonal 2 x 2 blocks across lanes j, j ^ 2, then each block's corners across j, j ^ 1.
    The quad's lanes only take part (shuffle mask 0xF << (tid & 0x1C))."""
    tid = b.special("tid.x")
    quad = b.op("shl.b32", Imm(0xF, "b32"), b.op("and.b32", tid, Imm(0x1C, "b32")))
    w = list(h)
    for d, bit in ((2, 2), (1, 1)):
        # block step (d = 2): lanes 0, 1 send words 2, 3 and take the partner's 0, 1 there; lanes 2, 3 the mirror.
        # corner step (d = 1): even lanes send words 1, 3 and take the partner's 0, 2 there; odd lanes the mirror.
        low = b.op("setp.eq.u32", b.op("and.b32", tid, Imm(bit, "b32")), Imm(0, "u32"))
        pairs = ((0, 2), (1, 3)) if d == 2 else ((0, 1), (2, 3))  # (word kept by the low lane, word it sends)
        for a, c in pairs:
            send = b.op("selp.b32", w[c], w[a], low, type="b32")
            got = b.op("shfl.sync.bfly.b32", send, Imm(d, "u32"), Imm(0x1F, "b32"), quad, type="b32")
            w[a], w[c] = b.op("selp.b32", w[a], got, low, type="b32"), b.op("selp.b32", got, w[c], low, type="b32")
    return w


def build_from_f16(arch, widen: bool = False, copy: bool = False):
    """fp16 activations (a torch user's) for the kernels that read another form: permute_f16 — into the register-A
    wgmma MMQ's K order (as convert_f16_perm, nothing to round, no flag: every value is an fp16 already), one 16-byte
    load a thread of 8 consecutive columns and one output group stored after the quad's transpose (_rega_stores) —
    or, widen, convert_f32 — fp16 → fp32 exactly, for the routes that read fp32 x —, or, copy, copy_f16 — as they are, into
    scratch, where a natural-order fp16 GEMM's tensor map points (convert_f16's output for an fp32 x). 8 values a
    thread."""
    kind = "convert_f32" if widen else "copy_f16" if copy else "permute_f16"
    b = KernelBuilder(ActKernel(kind).name, arch, "fp16 activations → fp32 (exact)" if widen else
                      "fp16 activations copied as they are" if copy else
                      "fp16 activations into the register-A wgmma MMQ's K order", block=(THREADS, 1, 1))
    x_p, y_p = b.param("x", "u64", "ptr:in"), b.param("y", "u64", "ptr:out")
    n_p = b.param("n8", "u32")  # number of 8-value groups
    b.meta.update(values_per_thread=PER_THREAD, grid=f"ceil(n8 / {THREADS})")
    if not widen and not copy:
        b.meta.update(k_order="layouts.q4k_rega_k_order() within each 64-column chunk")
    b.pdl_head()  # the kernel after it may launch now (it waits before reading what this writes)
    X, Y = b.ptr(x_p), b.ptr(y_p)
    n8 = b.ld_param(n_p, "u32")
    i = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(THREADS, "u32"), b.special("tid.x"))
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", i, n8), uniform=False)
    w = b.regs("b32", 4)  # columns (0, 1), (2, 3), (4, 5), (6, 7) of the group
    b.emit("ld.global.nc.v4.b32", b.vec(w), Mem(b.op("mad.wide.u32", i, Imm(16, "u32"), X)))
    if widen:
        v = []
        for word in w:
            lo, hi = b.reg("b16"), b.reg("b16")
            b.emit("mov.b32", b.vec([lo, hi]), word)
            v += [b.op("cvt.f32.f16", lo), b.op("cvt.f32.f16", hi)]
        dst = b.op("mad.wide.u32", i, Imm(32, "u32"), Y)
        b.emit("st.global.v4.f32", Mem(dst), b.vec(v[:4]))
        b.emit("st.global.v4.f32", Mem(dst, 16), b.vec(v[4:]))
    elif copy:
        b.emit("st.global.v4.b32", Mem(b.op("mad.wide.u32", i, Imm(16, "u32"), Y)), b.vec(w))
    else:  # (b', b' + 2) for b' = 0, 1, 4, 5: the low or the high halves of words (0, 1) and (2, 3)
        h = [b.op("prmt.b32", w[2 * (q >> 1)], w[2 * (q >> 1) + 1], Imm(0x7632 if q & 1 else 0x5410, "b32"))
             for q in range(4)]
        _rega_stores(b, h, i, Y)
    b.place(done)
    b.emit("ret")
    return b.finish()


def overflowed(b, words):
    """Whether a half of the fp16x2 `words` is inf or NaN (its exponent bits all ones): a predicate."""
    over = None
    for w in words:
        for mask in (0x7C00, 0x7C000000):
            p = b.op("setp.eq.u32", b.op("and.b32", w, Imm(mask, "b32")), Imm(mask, "u32"))
            over = p if over is None else b.op("or.pred", over, p)
    return over


# Tiny activations. fp16's normal range ends at 2^-14: below it a value keeps an absolute error of up to 2^-25, so a
# token whose whole row is tiny loses the GEMM's relative accuracy (a row of scale 1e-5: ~2e-3 of float64; 1e-6:
# ~2e-2). The conversions raise the same flag as for an overflow where a group of values lies wholly under
# TINY_GROUP (yet is not all zero: zeros are exact); the fixup behind the GEMM then recomputes exactly each token
# whose row max is under TINY_ROW (fixup.py). Every row under TINY_ROW has such groups (its values round to at most
# TINY_ROW in fp16), and a row of O(1) activations has none (8 Gaussian values under 2^-11: ~1e-27), so the flag
# stays down for real activations. Rows between the two bounds keep ~3e-4 of float64 (bench/NOTES.md, 2026-12-07).
TINY_GROUP_F16_BITS = 0x1000  # 2^-11 as fp16 bits: a half under it has bits 12-14 clear (exponent field < 4)
TINY_ROW = 2.0 ** -12


# Both tests read the fp32 values before rounding, from their largest magnitude: RN to fp16 is monotone, so a group
# leaves fp16 exactly where its largest |v| is 65520 or more (or NaN), and rounds wholly under 2^-11 exactly where
# that |v| is under 2^-11 - 2^-23 (the midpoint under 2^-11: a tie rounds to even, 2^-11). On 8 values: 7 FMNMX
# (the abs folds in) and a few compares, where testing the fp16 words took ~23 SASS.
F16_OVER_F32_BITS = 0x477FF000  # 65520 = 65504 + half an ulp: from here fp16 rounds to inf
F16_TINY_F32_BITS = 0x39FFF000  # 2^-11 - 2^-23: under it fp16 rounds to under 2^-11 (TINY_GROUP_F16_BITS)


def _max_magnitude_bits(b, values):
    """The bits of the largest |v| of the fp32 `values` (NaN wins: max.NaN), a balanced tree of maxes."""
    m = [b.op("abs.f32", v) for v in values]
    while len(m) > 1:
        m = [b.op("max.NaN.f32", m[i], m[i + 1]) if i + 1 < len(m) else m[i] for i in range(0, len(m), 2)]
    return b.op("mov.b32", m[0])


def _tiny(b, u):
    return b.op("setp.lo.u32", b.op("sub.u32", u, Imm(1, "u32")), Imm(F16_TINY_F32_BITS - 1, "u32"))  # 0 < |v| < ..


def too_small(b, values):
    """Whether the fp32 `values` (one group) round to fp16 wholly under 2^-11 while some value is not zero: a
    predicate (TINY_GROUP_F16_BITS)."""
    return _tiny(b, _max_magnitude_bits(b, values))


def conversion_flag(b, values):
    """Whether converting the fp32 `values` (one group) to fp16 needs the exact fallback: some value is not finite
    in fp16 (overflowed on its words), or the group is too small for fp16 (too_small). A predicate."""
    u = _max_magnitude_bits(b, values)
    return b.op("or.pred", b.op("setp.hs.u32", u, Imm(F16_OVER_F32_BITS, "u32")), _tiny(b, u))


def sub_block_sum(b, h):
    """moe_gather_sums' Σx: this thread's 8 fp16 values (the halves of `h`, as stored) summed in fp32 in
    input column order, then over its quad (input groups 4s .. 4s + 3: sub-block s of the row) by shfl.bfly 1 and
    2; returns the sum as fp16 (hi, lo): lo the rest, rounded."""
    halves = []
    for q in range(4):  # h[q] = (column b', column b' + 2), b' = (q & 1) + 4·(q >> 1)
        lo, hi = b.reg("b16"), b.reg("b16")
        b.emit("mov.b32", b.vec([lo, hi]), h[q])
        halves += [((q & 1) + 4 * (q >> 1), lo), ((q & 1) + 4 * (q >> 1) + 2, hi)]
    acc = None
    for _, v in sorted(halves, key=lambda t: t[0]):
        f = b.op("cvt.f32.f16", v)
        acc = f if acc is None else b.op("add.rn.f32", acc, f)
    # the quad's lanes only (a quad is one row's, K / 8 a multiple of 4: its lanes reach here together)
    quad = b.op("shl.b32", Imm(0xF, "b32"), b.op("and.b32", b.special("tid.x"), Imm(0x1C, "b32")))
    for d in (1, 2):
        acc = b.op("add.rn.f32", acc, b.op("shfl.sync.bfly.b32", acc, Imm(d, "u32"), Imm(0x1F, "b32"), quad,
                                            type="f32"))
    hi = b.op("cvt.rn.f16.f32", acc)
    return hi, b.op("cvt.rn.f16.f32", b.op("sub.rn.f32", acc, b.op("cvt.f32.f16", hi)))


def store_sub_block_sum(b, hi, lo, r, k8, n, XS):
    """sub_block_sum's (hi, lo) of input group r's sub-block into row n of xs (K / 16 halves a row): the quad's
    first thread (r % 4 = 0) stores them."""
    s = b.op("shr.u32", r, Imm(2, "u32"))  # sub-block r / 4 of the row
    col = b.op("add.u32", b.op("shl.b32", b.op("shr.u32", s, Imm(3, "u32")), Imm(4, "u32")),
               b.op("and.b32", s, Imm(7, "b32")))  # 16·(s / 8) + s % 8
    at = b.op("mad.wide.u32", b.op("mad.lo.u32", n, b.op("shr.u32", k8, Imm(1, "u32")), col), Imm(2, "u32"), XS)
    first = b.op("setp.eq.u32", b.op("and.b32", r, Imm(3, "b32")), Imm(0, "u32"))
    b.emit("st.global.b16", Mem(at), hi, pred=first)
    b.emit("st.global.b16", Mem(at, 16), lo, pred=first)


KERNEL = KernelDef(ActKernel("convert_f16").name, "fp32 → fp16 activations with an overflow flag", build)
KERNEL_PERMUTE = KernelDef(ActKernel("permute_f16").name, "fp16 activations in the register-A wgmma MMQ's K order",
                           build_from_f16, archs=("sm_90a",))
KERNEL_COPY = KernelDef(ActKernel("copy_f16").name, "fp16 activations copied as they are (into scratch: the "
                        "natural-order fp16 GEMMs' tensor maps point there)", lambda arch: build_from_f16(arch, copy=True),
                        archs=("sm_90a", "sm_120a"))
KERNEL_WIDEN = KernelDef(ActKernel("convert_f32").name, "fp16 activations → fp32 (exact)",
                         lambda arch: build_from_f16(arch, widen=True))
KERNEL_PERM = KernelDef(ActKernel("convert_f16", rega=True).name, "fp32 → fp16 activations in the register-A wgmma "
                        "MMQ's K order, with an overflow flag", lambda arch: build(arch, permuted=True),
                        archs=("sm_90a",))
