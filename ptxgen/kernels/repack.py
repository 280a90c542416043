"""repack_q8_0_ra: Q8_0's GGUF bytes → the layout q8_0_ra the register-A GEMMs mmq_q8_0_wgmma_ra_n*_rp read (a
copy made once a weight on the device; codecs/q8_0.py describes the layout, repack_ra is its NumPy form). Thread i
writes word i of the copy: word w of 256-weight group G (72 a group) from raw group G's 272 bytes — a d word two
fp16 d's, a quant word four quant bytes (two 2-byte loads, a prmt) XOR 0x80."""
from __future__ import annotations

from ..builder import KernelBuilder
from ..codecs import q8_0
from ..ir import Imm, Mem
from ..specs import CodecKernel
from . import KernelDef

THREADS = 256
WORDS = q8_0.RA_GROUP_BYTES // 4  # 72 words a group
RAW_GROUP = 8 * q8_0.BLOCK_BYTES  # 272


def name(fmt: str = "q8_0") -> str:
    return CodecKernel("repack", fmt).name


def build(arch):
    b = KernelBuilder(name(), arch, "q8_0 → its register-A layout q8_0_ra (codecs.q8_0), a word a thread",
                      block=(THREADS, 1, 1))
    w_p, y_p, n_p = b.param("w", "u64", "ptr:in"), b.param("out", "u64", "ptr:out"), b.param("groups", "u32", "scalar")
    b.meta.update(grid=f"ceil(groups · {WORDS} / {THREADS})", layout=q8_0.RA_LAYOUT, fmt="q8_0")
    b.pdl_head()
    W, Y, n = b.ptr(w_p), b.ptr(y_p), b.ld_param(n_p, "u32")
    i = b.op("mad.lo.u32", b.special("ctaid.x"), Imm(THREADS, "u32"), b.special("tid.x"))
    done = b.label("done")
    b.bra(done, pred=b.op("setp.ge.u32", i, b.op("mul.lo.u32", n, Imm(WORDS, "u32"))), uniform=False)
    grp = b.op("div.u32", i, Imm(WORDS, "u32"))
    wg = b.op("sub.u32", i, b.op("mul.lo.u32", grp, Imm(WORDS, "u32")))
    c, j = b.op("shr.u32", wg, Imm(2, "u32")), b.op("and.b32", wg, Imm(3, "b32"))  # chunk, word in it
    # quant chunks: step st = #(c ≥ RA_QUANT_CHUNK[1:]), chunk t = c − RA_QUANT_CHUNK[st]; d chunks RA_D_CHUNKS
    qc = q8_0.RA_QUANT_CHUNK
    ge = [b.op("selp.u32", Imm(1, "u32"), Imm(0, "u32"), b.op("setp.ge.u32", c, Imm(q, "u32"))) for q in qc[1:]]
    st = b.op("add.u32", b.op("add.u32", ge[0], ge[1]), ge[2])
    table = sum(q << (8 * i) for i, q in enumerate(qc))  # RA_QUANT_CHUNK as bytes of one word
    first = b.op("shr.u32", b.op("mov.b32", Imm(table, "b32")), b.op("shl.b32", st, Imm(3, "u32")))
    t = b.op("sub.u32", c, b.op("and.b32", first, Imm(0xFF, "b32")))
    blk = b.op("add.u32", b.op("shl.b32", st, Imm(1, "u32")), b.op("shr.u32", j, Imm(1, "u32")))  # 2st + sb
    qoff = b.op("add.u32", b.op("mad.lo.u32", blk, Imm(q8_0.BLOCK_BYTES, "u32"), Imm(q8_0.QS_OFFSET, "u32")),
                b.op("add.u32", b.op("shl.b32", b.op("and.b32", j, Imm(1, "b32")), Imm(4, "u32")),
                     b.op("shl.b32", t, Imm(1, "u32"))))  # + 16wi + 2t: bytes (2t, 2t + 1); + 8: (2t + 8, 2t + 9)
    dword = b.op("or.pred", *(b.op("setp.eq.u32", c, Imm(dc, "u32")) for dc in q8_0.RA_D_CHUNKS))
    doff = b.op("mul.lo.u32", j, Imm(2 * q8_0.BLOCK_BYTES, "u32"))  # d of blocks 2j, 2j + 1: + 0 and + 34
    lo = b.op("selp.b32", doff, qoff, dword)
    hi = b.op("add.u32", lo, b.op("selp.u32", Imm(q8_0.BLOCK_BYTES, "u32"), Imm(8, "u32"), dword))
    src = b.op("mad.wide.u32", grp, Imm(RAW_GROUP, "u32"), W)
    a = b.op("ld.global.nc.u16", Mem(b.op("add.u64", src, b.op("cvt.u64.u32", lo))), type="u32")
    c2 = b.op("ld.global.nc.u16", Mem(b.op("add.u64", src, b.op("cvt.u64.u32", hi))), type="u32")
    q = b.op("xor.b32", b.op("prmt.b32", a, c2, Imm(0x5140, "b32")), Imm(0x80808080, "b32"))
    d = b.op("prmt.b32", a, c2, Imm(0x5410, "b32"))
    b.emit("st.global.u32", Mem(b.op("mad.wide.u32", i, Imm(4, "u32"), Y)), b.op("selp.b32", d, q, dword))
    b.place(done)
    b.emit("ret")
    return b.finish()


KERNELS = [KernelDef(name(), "Q8_0 → the register-A GEMM's layout q8_0_ra (mmq_q8_0_wgmma_ra_n*_rp), once a weight",
                     build, archs=("sm_90a",))]
