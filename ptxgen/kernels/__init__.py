"""The kernel registry: every kernel ptxgen emits, by name, with the arches it is built for."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..arch import TARGETS, Arch, get_arch
from ..builder import Kernel


@dataclass(frozen=True)
class KernelDef:
    name: str
    doc: str
    build: Callable[[Arch], Kernel]
    archs: tuple = TARGETS

    def for_arch(self, arch) -> Kernel:
        """This kernel built for `arch`. sm_80 is let through (it lowers as sm_89) for the runtime's source="dsl"
        builds, whose candidates on an Ampere device are sm_80; the CLIs refuse it (ptxgen.arch.target_archs)."""
        arch = get_arch(arch)
        if arch.name not in self.archs and arch.name != "sm_80":
            raise ValueError(f"kernel {self.name} is not built for {arch.name}; it is built for {', '.join(self.archs)}")
        return _resident(self.build(arch), arch)


def smem_fit(arch: Arch, smem: int) -> int:
    """How many CTAs of `smem` bytes of shared memory an SM of `arch` holds (0 if not one): an SM has the opt-in
    limit plus 1 KB, and each CTA takes 1 KB of it besides its own."""
    return (arch.max_smem_per_block + 1024) // (smem + 1024)


def smem_share(arch: Arch, ctas: int) -> int:
    """The shared memory each of `ctas` CTAs on one SM of `arch` may take (smem_fit's inverse)."""
    return (arch.max_smem_per_block + 1024) // ctas - 1024


def _resident(k: Kernel, arch: Arch) -> Kernel:
    """meta `ctas_per_sm` (what the runtime plans grids and splits with) no more than the target's shared memory
    holds: an SM has the opt-in limit plus 1 KB, and each CTA takes 1 KB of it besides its own (sm_89 and sm_120a
    hold 100 KB where the H200 holds 228: a build tuned for 4 CTAs of 54 KB there fits one)."""
    c = k.meta.get("ctas_per_sm")
    smem = k.static_smem + k.dynamic_smem
    if isinstance(c, int) and smem:
        fit = max(1, smem_fit(arch, smem))
        if fit < c:
            k.meta["ctas_per_sm"] = fit
    return k


def _registry() -> dict[str, KernelDef]:
    from . import (convert_f16, dequantize, fixup, frags, gemv, gemv_codec, gemv_mma_codec, gemv_t1,
                   gemv_xr, gemv_xt, mmq, moe_group, quantize_q8_1)

    defs = [quantize_q8_1.KERNEL, quantize_q8_1.KERNEL_MMQ, *dequantize.KERNELS, *frags.KERNELS, convert_f16.KERNEL,
            convert_f16.KERNEL_PERM, convert_f16.KERNEL_PERMUTE, convert_f16.KERNEL_COPY, convert_f16.KERNEL_WIDEN, *gemv.kernel_defs(), *gemv_t1.PREPS, *gemv_t1.KERNELS, *gemv_codec.KERNELS, *gemv_mma_codec.kernel_defs(), gemv_xr.KERNEL, *gemv_xt.KERNELS, *mmq.kernel_defs(), *fixup.KERNELS,
            moe_group.KERNEL, moe_group.KERNEL_GATHER, moe_group.KERNEL_GATHER_SUMS, *moe_group.KERNELS_GATHER_X16,
            moe_group.KERNEL_CHECK]
    return {d.name: d for d in defs}


KERNELS = _registry()

# Kernels no dispatch rule selects: they stay buildable from the DSL (the runtime builds one on demand when a knob,
# a probe or a benchmark asks for it) but are not shipped in emitted/. Each with why (bench/NOTES.md has the runs).
NOT_SHIPPED = {
    "mmq_q4_k_wgmma_ra_n128_mc2": "cluster multicast of the activation tiles: never dispatched (measured no faster)",
    "mmq_q4_k_wgmma_ra_n256_mc2": "cluster multicast of the activation tiles: never dispatched (measured no faster)",
    "mmq_q4_k_wgmma_ra_n192": "a 192-token tile: the n256 / n128 register-A builds cover every T faster",
    "mmq_q4_k_wgmma_n64": "wgmma with A from shared memory: PTXGEN_MMQ_REGA=0 only; register-A is faster",
    "mmq_q4_k_wgmma_n128": "wgmma with A from shared memory: PTXGEN_MMQ_REGA=0 only; register-A is faster",
    "mmq_q4_k_wgmma_n256": "wgmma with A from shared memory: PTXGEN_MMQ_REGA=0 only; register-A is faster",
    "gemv_q4_k_xr": "T = 1 with x in registers: PTXGEN_Q4K_XR=1 only; 10-40% slower than the default decode kernels",
    "gemv_tq4_1s_tma_t4": "TQ4_1S at 3-8 tokens runs the tensor-core GEMV; the TMA lanes only with PTXGEN_TQ4_MMA=0",
    "gemv_tq4_1s_tma_t8": "TQ4_1S at 3-8 tokens runs the tensor-core GEMV; the TMA lanes only with PTXGEN_TQ4_MMA=0",
    "gemv_tq4_1s_xt_t1": "TQ4_1S's one-token GEMV on tables of x's products: slower than prep_tq4_1s + the TMA lane GEMV "
                         "(H200 graph µs 19.9 / 20.9 against 19.6 / 19.5 on 18944x3584 / 3584x18944; bench/NOTES.md, "
                         "2026-12-06; rule xtab_max_tokens tq4_1s 0)",
}
NOT_SHIPPED["mmq_q4_k_wgmma_ra_n64_m256_moe"] = (
    "a 256-row n64 MoE tile (consumers at 112 registers, whole-block stages): slower than the 128-row n64 at 32 x "
    "top-4 T = 448-576 (H100, h100_wide_32x4_dc53cbc.log); rule moe_wgmma_tile_pairs with an \"n64_m256\" entry "
    "reaches it")
NOT_SHIPPED["mmq_q4_k_wgmma_ra_n96_moe"] = ("a MoE token tile between n64 and n128: slower than n64 at 32 x top-4 "
                                            "T = 512 (69.7 -> 72.8 graph µs, bench/NOTES.md 2026-12-04); rule "
                                            "moe_wgmma_tile_pairs with an \"n96\" entry reaches it")
NOT_SHIPPED.update({f"gemv_{f}_f32_t16": "the codec GEMV for 9-16 tokens in one launch: Q6_K's measured slower than two "
                    "8-token launches (probe_gemv_codec_shapes_852097d.log), Q8_0's not timed yet" for f in ("q6_k", "q8_0")})
NOT_SHIPPED.update({n: "TQ4_1S on the few-token tensor-core builds (and their rotated records): slower than the TMA "
                    "lane and tensor-core GEMVs at T = 1, 2 and 8 (H100, 2026-12-05; rule codec_few_max_tokens tq4_1s 0)"
                    for nt in (1, 2, 4, 8) for n in (f"gemv_tq4_1s_mma_t{nt}", f"prep_rot16_t{nt}")})
NOT_SHIPPED.update({f"gemv_{f}_mma_t{nt}s": "the few-token GEMV with records shared by the CTA's warps: slower than the "
                    "per-warp builds for the K-quants (H100, 2026-12-05; rule few_shared_min_tokens 0)" for f in ("q4_k", "q5_k", "q6_k", "q8_0", "tq4_1s") for nt in (4, 8)})
NOT_SHIPPED.update({f"mmq_{f.lower()}_wgmma_ra_n{bn}_sk": "stream-K register-A GEMM: -7% to +4% against the uniform "
                    "plans (H100, 2026-12-05; rule mmq_stream_k_min_gain 0)" for f in ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s") for bn in (128, 256)})
NOT_SHIPPED.update({f"gemv_{f}_mma_n16": "the codecs' tensor-core GEMV for 9-16 tokens: slower than the register-A "
                    "GEMMs at T = 16 (56.0 / 48.9 against 53.1 / 36.5 µs, bench_op_q6k_mma_final.log)"
                    for f in ("q6_k", "q8_0")})
NOT_SHIPPED.update({n: "the int8 few-token Q4_K GEMV (digit-plane records) for 3-8 tokens: slower than the fp16 builds "
                    "at T = 4 on 4096x14336 and at T = 8 (H200, 2026-12-05; rule few_i8_max_tokens q4_K 2)"
                    for nt in (4, 8) for n in (f"gemv_q4_k_i8_t{nt}", f"gemv_q4_k_i8_t{nt}_fused")
                    if not n.endswith("t8_fused")})
NOT_SHIPPED.update({n: "the int8 few-token builds at 8 tokens for Q4_K / Q5_K: three planes a token take three n8 "
                    "tiles, slower than the fp16 t8 builds (H200 / H100, 2026-12-05; rule few_i8_max_tokens)"
                    for n in ("prep_q4k_i8_t8", "gemv_q5_k_i8_t8")})
# ... and those only a knob or a pinned path reaches (no default rule over a sweep of device x format x mode x arch
# x M x K x T, 2026-12-03: 3 devices, 13 M from 16 to 200000, 9-13 K, T = 1-130 and 15 larger; mul_mat_id over 5
# expert shapes), each with the knob:
_KNOB_ONLY = {
    "gemv_q4_k_mma_n16": "the exact 9-16-token tensor-core GEMV: PTXGEN_Q4K_MMA=on or PTXGEN_Q4K_T16H=off only (the "
                         "t16h builds run those tokens)",
    "gemv_q8_0_mma": "Q8_0's bulk-copy tensor-core GEMV: where its route runs (K a multiple of 256) Q8_0's rows are "
                     "16-byte multiples, so the TMA build gemv_q8_0_mma_tma runs",
    "mmq_q4_k_f16_n32": "the 32-token fp16 mma.sync tile: the skinny GEMM (mmq_<fmt>_rega_n32) runs T ≤ 32 unless "
                        "PTXGEN_MMQ_SKINNY=off",
}
_KNOB_ONLY.update({f"gemv_q4_k_t{t}": "Q4_K's fp32 lane GEMV for 2-8 tokens: the few-token and tensor-core GEMVs run "
                   "them unless PTXGEN_Q4K_MMA=off" for t in (2, 4, 8)})
_KNOB_ONLY.update({n: _KNOB_ONLY["mmq_q4_k_f16_n32"] for n in ("mmq_q4_k_f16_n32_x16", "mmq_q5_k_f16_n32",
                                                                "mmq_q5_k_f16_n32_x16")})
_KNOB_ONLY.update({n: "an int8 x Q8_1 tile mode=\"fast\" never picks (the fused n16, then quantize_q8_1_mmq + n32_pre, "
                   "then the fp16 GEMMs): a pinned path only (ops.mmq_launch path=\"q8\" / \"q8_pre\")"
                   for n in ("mmq_q4_k_q8_n32", "mmq_q4_k_q8_n64", "mmq_q4_k_q8_n16_pre", "mmq_q4_k_q8_n64_pre")})
NOT_SHIPPED.update(_KNOB_ONLY)
# a build's twin on fp16 x (_x16) is shipped where the build is
NOT_SHIPPED.update({n + "_x16": f"the fp16-x twin of {n}, which is not shipped: " + why for n, why in list(NOT_SHIPPED.items())
                    if n + "_x16" in KERNELS and n + "_x16" not in NOT_SHIPPED})
SHIPPED = {n: d for n, d in KERNELS.items() if n not in NOT_SHIPPED}


def unknown_kernel(name: str, names=None) -> str:
    """The error for a kernel name not in `names` (default: KERNELS): the few closest names, not hundreds."""
    import difflib

    close = difflib.get_close_matches(name, list(names if names is not None else KERNELS), n=5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"unknown kernel {name!r}; {hint}`ptxgen list --all` names them all"


def get_kernel(name: str) -> KernelDef:
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(unknown_kernel(name)) from None
