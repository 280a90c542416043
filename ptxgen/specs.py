"""Kernel specs that the builders and the runtime share: a spec's `name` is the one place a kernel's name is made.
Builder-free, so the runtime imports it without the kernel builders (ptxgen/kernels/*)."""
from __future__ import annotations

from dataclasses import dataclass


# MmqSpec.row_group's value and formats (kernels/mmq.py ROW_GROUP_NOTE): 8 rows of any K a multiple of 256 are
# 1680·K/256 bytes of Q6_K, a multiple of 16 — the register-A codecs whose rows can miss 16-byte multiples
ROW_GROUP = 8
ROW_GROUP_FORMATS = ("q6_K",)


@dataclass(frozen=True)
class MmqSpec:
    """One MMQ description: token tile BN and the tensor-core instruction. The block tile (BM x BN x BK),
    the dequant sequence (codecs.q4_k.f16_words), the work schedule and the epilogue are shared; the
    lowering is per instruction: mma.sync (sm_89, sm_120a) or wgmma (sm_90a)."""
    bn: int
    mma: str = "mma.sync"
    act: str = "f16"  # the activation format in the tensor cores: "f16" or "q8_1" (int8, mma.sync m16n8k32)
    fused: bool = True  # q8_1: quantize fp32 x inside the load pipeline; False: read quantize_q8_1's blocks;
    # fp16 mma.sync: convert fp32 x to fp16 inside the load pipeline; False: read convert_f16's fp16 x
    a_regs: bool = False  # wgmma: A (the dequantized weights) from registers instead of shared memory
    cluster: int = 1  # wgmma: CTAs per thread-block cluster; 2 = two M-tiles share each activation tile (multicast)
    convert: bool = False  # register-A wgmma: fp32 x converted inside the launch by the producer warpgroup's idle warps
    prepared: bool = False  # register-A wgmma: A fragments written by dequantize_<fmt>_frags first and loaded by
    # TMA (no dequant in the K loop; kernels/mmq.py PREPARED_NOTE); without a_regs ("f16a"): the weights
    # dequantized first as fp16 rows (dequantize_<fmt>), A tiles by TMA, both wgmma operands from shared memory
    grouped: bool = False  # mul_mat_id's schedule — items (M tile, expert's token tile) from moe_group's work list,
    # y rows scattered by pair; x rows gathered by pair (fp16 mma.sync, kernels/mmq_moe.py) or by
    # moe_gather before the register-A wgmma build
    fmt: str = "q4_K"  # the weights' codec: Q4_K's raw ring and dequant, or (grouped only) any codec's run8
    int_weights: bool = False  # grouped register-A wgmma, Q4_K: A = q·sc' exact, a block accumulator scaled by d in
    # fp32, the min term as k16 MMAs against the gathered x's sub-block sums (kernels/mmq.py _iw_steps)
    bm: int = 128  # wgmma: the CTA's M tile; 256 (grouped register-A Q4_K builds) = four consumer warpgroups of 64
    # rows sharing each activation tile, one CTA an SM
    stream: bool = False  # register-A wgmma (dense, x converted first): stream-K — CTA c takes K-steps [c·L, (c+1)·L)
    # of the tiles' K ranges laid end to end (kernels/mmq.py STREAM_NOTE), not whole items from the queue
    csplit: bool = False  # register-A wgmma (dense, fp16 x): cluster split-K — a tile's K splits are the CTAs of one
    # thread-block cluster (its size the launch's splits), summed through distributed shared memory (kernels/mmq.py
    # CSPLIT_NOTE), not through partials in global memory and the last CTA's fixup
    row_group: int = 1  # register-A wgmma, a codec whose rows are not 16-byte multiples (Q6_K where K is not a multiple
    # of 2048): the weights seen as rows of row_group weight rows (a multiple of 16 bytes), a tile's A box by
    # row_group TMA loads, its rows permuted in y's epilogue (kernels/mmq.py ROW_GROUP_NOTE)

    @property
    def name(self) -> str:
        if self.act == "q8_1":
            return f"mmq_{self.fmt.lower()}_q8_n{self.bn}" + ("" if self.fused else "_pre")
        if self.mma == "mma.sync":
            return f"mmq_{self.fmt.lower()}_f16_n{self.bn}" + ("" if self.fused else "_x16") + ("_moe" if self.grouped else "")
        mc = f"_mc{self.cluster}" if self.cluster > 1 else ""
        cx = "_cx" if self.convert else ""
        kind = (("pre" if self.a_regs else "f16a") if self.prepared else "iw" if self.int_weights
                else "ra" if self.a_regs else "")
        wide = f"_m{self.bm}" if self.bm != 128 else ""
        wide += f"_g{self.row_group}" if self.row_group > 1 else ""
        return (f"mmq_{self.fmt.lower()}_wgmma_{kind + '_' if kind else ''}n{self.bn}" + wide + mc + cx
                + ("_sk" if self.stream else "") + ("_cs" if self.csplit else "") + ("_moe" if self.grouped else ""))

    @classmethod
    def for_path(cls, path: str, bn: int) -> "MmqSpec":
        """The spec of an MMQ lowering path as runtime.ops.mmq_launch names them (MMQ_PATHS) with token tile bn."""
        specs = {"mma.sync": cls(bn), "mma.sync_x16": cls(bn, fused=False), "wgmma": cls(bn, "wgmma"),
                 "wgmma_ra_x16": cls(bn, "wgmma", a_regs=True),
                 "wgmma_ra_cx": cls(bn, "wgmma", a_regs=True, convert=True),
                 "wgmma_pre_x16": cls(bn, "wgmma", a_regs=True, prepared=True),
                 "wgmma_pre_cx": cls(bn, "wgmma", a_regs=True, convert=True, prepared=True),
                 "wgmma_f16a_x16": cls(bn, "wgmma", prepared=True),
                 "wgmma_f16a_cx": cls(bn, "wgmma", convert=True, prepared=True),
                 "wgmma_ra_mc": cls(bn, "wgmma", a_regs=True, cluster=2),
                 "wgmma_ra_sk": cls(bn, "wgmma", a_regs=True, stream=True),
                 "wgmma_ra_cs": cls(bn, "wgmma", a_regs=True, csplit=True),
                 "q8": cls(bn, act="q8_1"), "q8_pre": cls(bn, act="q8_1", fused=False)}
        try:
            return specs[path]
        except KeyError:
            raise ValueError(f"no MMQ path {path!r} (have: {', '.join(specs)})") from None


@dataclass(frozen=True)
class CodecKernel:
    """A kernel of the codec-driven families (ptxgen/codecs): one per codec whose routes need it. `kind`:
    "gemv" (the exact decode GEMV for up to `tokens` tokens; `x16`: on fp16 x, each value widened as it is
    loaded), "gemv_id" / "gemv_idg" (mul_mat_id's per-pair and expert-grouped GEMVs; `x16` likewise), "dequantize", "frags" (the
    prepared GEMM's fp16 fragments), "fixup"."""
    kind: str
    fmt: str
    tokens: int = 1
    x16: bool = False

    @property
    def name(self) -> str:
        f = self.fmt.lower()
        x16 = "_x16" if self.x16 else ""
        names = {"gemv": f"gemv_{f}_f32_t{self.tokens}{x16}", "gemv_id": f"gemv_{f}_f32_id{x16}",
                 "gemv_idg": f"gemv_{f}_f32_idg{x16}", "dequantize": f"dequantize_{f}", "frags": f"dequantize_{f}_frags",
                 "fixup": f"mul_mat_fixup_{f}"}
        return _named(names, self.kind, "codec kernel")



@dataclass(frozen=True)
class GemvKernel:
    """A kernel of the decode families (ptxgen/kernels/gemv.py, gemv_t1.py) for `fmt` ("q4_K", "tq4_1s", "q8_0").
    `kind`: "gemv" (the lane-per-block or 8-weight-unit GEMV for up to `tokens` tokens; `fast`: int8 x Q8_1 with
    dp4a, Q8_0's only mode and so not in its name; `tma`: weights by TMA; `fused`: the rotation in the prologue),
    "mma" (the mma.sync GEMV for 8 tokens, 16: two token groups; `small`: one m16 tile per warp; `tma`: a codec's
    build fed by one TMA box a step), "few" (Q4_K's
    gemv_q4_k_mma_t<tokens>: (hi, lo) records, or hi parts alone with `hi_only`; `fused`: the records built in
    the launch), "skinny" (Q4_K's GEMM for token groups of `tokens`), and the activation preps: "prep_lanes" (the
    lane layout; `fast`: Q8_1), "prep_mma" (the mma GEMV's tiles), "prep_few" (the few-token records)."""
    kind: str
    fmt: str
    tokens: int = 1
    fast: bool = False
    tma: bool = False
    fused: bool = False
    hi_only: bool = False
    small: bool = False
    shared: bool = False  # "few": the records shared by the CTA's warps (gemv_<fmt>_mma_t<tokens>s)
    i8: bool = False  # "few", "prep_few": int8 MMAs on the activation's digit planes (gemv_<fmt>_i8_t<tokens>)
    x16: bool = False  # the preps and the one-launch ("few", fused) builds: read fp16 x (a torch model's
    # activations; no convert_f32 launch before them)
    xtab: bool = False  # "gemv" (TQ4_1S, one token): codebook products of x looked up per qs byte from tables
    # built from x by the CTA (gemv_tq4_1s_xt_t1; kernels/gemv_xt.py)

    @property
    def name(self) -> str:
        f = self.fmt.lower()
        rot = f == "tq4_1s"
        fast = "_fast" if self.fast and f != "q8_0" else ""
        fused, t = "_fused" if self.fused else "", f"t{self.tokens}" + ("h" if self.hi_only else "")
        names = {"gemv": f"gemv_{f}{fast}{'_tma' if self.tma else ''}{'_xt' if self.xtab else ''}_t{self.tokens}{fused}",
                 "mma": f"gemv_{f}_mma" + ("_m16" if self.small else "") + ("_tma" if self.tma else "")
                        + (f"_n{self.tokens}" if self.tokens > 8 else ""),
                 "few": (f"gemv_{f}_i8_{t}{fused}" if self.i8 else f"gemv_{f}_mma_{t}{'s' if self.shared else ''}{fused}")
                        + ("_x16" if self.x16 else ""),
                 "skinny": f"mmq_{f}_rega_n{self.tokens}",
                 "prep_lanes": ("prep_tq4_1s" + ("_q8" if self.fast else "") if rot else
                                "prep_q8_lanes" if self.fast else "prep_f32_lanes") + ("_x16" if self.x16 else ""),
                 "prep_mma": ("prep_tq4_1s_mma" if rot else "prep_mma_f16") + ("_x16" if self.x16 else ""),
                 # the few-token records: Q4_K's K order for the K-quants with a min (Q4_K, Q5_K), the codecs'
                 # 16-element sub-block order for the others (Q6_K, Q8_0: formats.tq4_1s.q4k_mma_records' order),
                 # TQ4_1S's of the rotated activation
                 "prep_few": (f"prep_q{'6' if f in ('q6_k', 'q8_0') else '4'}k_i8_{t}" if self.i8 else f"prep_q4k_{t}" if f in ("q4_k", "q5_k") else f"prep_rot16_{t}" if f == "tq4_1s" else
                              f"prep_sub16_{t}") + ("_x16" if self.x16 else "")}
        return _named(names, self.kind, "decode kernel")


@dataclass(frozen=True)
class ActKernel:
    """A kernel that prepares the activations (or, for mul_mat_id, their grouping) ahead of a GEMM or GEMV, whatever
    the weights' codec. `kind`: "convert_f16" (fp32 → fp16; `rega`: in the register-A wgmma build's K order),
    "permute_f16" (fp16 x into that K order), "copy_f16" (fp16 x as it is, into scratch: the natural-order
    fp16 GEMMs' tensor maps are over scratch), "convert_f32" (fp16 → fp32, for the kernels that read fp32 x),
    "quantize_q8_1" (`mmq`: in the int8 MMQ's layout, else ggml's block_q8_1), "rotate" (TQ4_1S's rotation,
    fp32 → fp32; `f16`: fp32 or fp16 → fp32 and, for the fp16 GEMMs, fp16 with an overflow flag), "group" (mul_mat_id's expert grouping; `gather`: and x gathered into fp16 in that order, `sums`:
    with each row's sub-block sums)."""
    kind: str
    rega: bool = False
    mmq: bool = False
    gather: bool = False
    sums: bool = False
    f16: bool = False
    x16: bool = False  # "group" with gather: x is fp16 (moe_gather(_sums)_x16)

    @property
    def name(self) -> str:
        names = {"convert_f16": "convert_f16" + ("_perm" if self.rega else ""), "permute_f16": "permute_f16", "copy_f16": "copy_f16",
                 "convert_f32": "convert_f32",
                 "quantize_q8_1": "quantize_q8_1" + ("_mmq" if self.mmq else ""), "rotate": "rotate_tq4_1s" + ("_f16" if self.f16 else ""),
                 "group": ("moe_gather" + ("_sums" if self.sums else "") + ("_x16" if self.x16 else "")) if self.gather
                          else "moe_group"}
        return _named(names, self.kind, "activation kernel")


def _named(names: dict, kind: str, what: str) -> str:
    """names[kind]: a spec's kernel name by its kind, or a ValueError listing the kinds there are."""
    try:
        return names[kind]
    except KeyError:
        raise ValueError(f"no {what} kind {kind!r} (have: {', '.join(names)})") from None
