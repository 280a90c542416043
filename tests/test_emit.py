"""L0 (emitted/ is golden), L1 (every kernel × arch compiles, zero spills), L2 (SASS)."""
import json
import subprocess
import sys

import pytest

from conftest import REPO
from ptxgen.arch import TARGETS, get_arch
from ptxgen.cli import emit_arch, main
from ptxgen.kernels import KERNELS, NOT_SHIPPED, SHIPPED
from ptxgen.probes import probe_ptx
from ptxgen.runtime.compiler import compile_ptx
from ptxgen.runtime.compiler import sass as _sass


def sass(cubin: bytes) -> str:
    """nvdisasm's SASS; the test skips with the reason where nvdisasm is missing (the `tools` extra has it)."""
    try:
        return _sass(cubin)
    except FileNotFoundError as e:
        pytest.skip(str(e))

CASES = [(k, a) for k in KERNELS for a in KERNELS[k].archs]


@pytest.mark.parametrize("arch", TARGETS)
def test_emitted_is_golden(arch, tmp_path):
    emit_arch(get_arch(arch), list(SHIPPED.values()), tmp_path)
    golden = REPO / "emitted" / arch
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in golden.iterdir() if p.is_file()), "regenerate: ptxgen emit"
    for name in made:
        assert (tmp_path / name).read_text() == (golden / name).read_text(), f"emitted/{arch}/{name} is stale: ptxgen emit"


def test_unshipped_kernels_are_built_on_demand_not_emitted(monkeypatch):
    """A kernel of ptxgen.kernels.NOT_SHIPPED is missing from emitted/ and `ptxgen emit`'s default set, yet the
    runtime finds it for its targets (built from the DSL, the same PTX `ptxgen emit --kernel` writes)."""
    from ptxgen.runtime import kernels

    assert set(NOT_SHIPPED) <= set(KERNELS)
    for name, d in KERNELS.items():
        shipped = {a for a in TARGETS if (REPO / "emitted" / a / f"{name}.ptx").exists()}
        assert shipped == (set() if name in NOT_SHIPPED else set(d.archs)), name
    name = "mmq_q4_k_wgmma_ra_n192"
    assert kernels.available(name) == ["sm_90a"] and name not in kernels.manifest("sm_90a")
    text, entry = kernels.ptx_source(name, "sm_90a")
    assert text == KERNELS[name].for_arch("sm_90a").ptx() and entry["kernel"] == name


@pytest.mark.parametrize("arch", TARGETS)
def test_emitted_ptx_is_ascii(arch):
    for p in (REPO / "emitted" / arch).glob("*.ptx"):
        p.read_bytes().decode("ascii")  # ptxas of CUDA 13.0 rejects any other byte


def test_manifest_describes_the_abi():
    m = json.loads((REPO / "emitted" / "sm_89" / "manifest.json").read_text())
    k = {e["kernel"]: e for e in m["kernels"]}["dequantize_q4_k"]
    assert [p["name"] for p in k["params"]] == ["w", "y", "nsuper"]
    assert [p["size"] for p in k["params"]] == [8, 8, 4] and k["threads"] == 256 and len(k["sha256"]) == 64


def _compile(k, arch, kernel):
    """As the runtime will: nvJitLink, or for a kernel the driver JIT-compiles (meta compile "whole-program",
    setmaxnreg honoured) the ptxas binary as a whole program — skipped where there is no ptxas."""
    whole = k.meta.get("compile") == "whole-program"
    try:
        return compile_ptx(k.ptx(), arch, name=kernel, whole_program=whole)
    except FileNotFoundError as e:
        pytest.skip(f"{kernel} compiles as a whole program: {e}")


@pytest.mark.parametrize("kernel,arch", CASES)
def test_compiles_without_spills(kernel, arch):
    k = KERNELS[kernel].for_arch(arch)
    res = _compile(k, arch, kernel)
    r = res.resources[k.entry]
    assert r["spill_stores"] == r["spill_loads"] == r["lmem"] == 0
    assert r["stack"] <= get_arch(arch).allowed_stack(k.ptx())  # sm_120a's TMA kernels: an 8-byte ABI frame
    assert 0 < r["registers"] <= 255


EXPECTED_SASS = {"quantize_q8_1": ["SHFL.BFLY", "F2FP"], "dequantize_q4_k": ["F2FP", "LDG.E"],
                 "rotate_tq4_1s": ["SHFL.BFLY"], "rotate_tq4_1s_f16": ["SHFL.BFLY", "F2FP"], "prep_tq4_1s": ["SHFL.BFLY", "STG.E"],
                 "prep_tq4_1s_q8": ["SHFL.BFLY", "F2I", "STG.E.U8"],
                 "prep_q8_lanes": ["SHFL.BFLY", "F2I", "STG.E.U8"], "prep_f32_lanes": ["LDG.E", "STG.E"],
                 "quantize_q8_1_mmq": ["SHFL.BFLY", "F2I", "STG.E.U8", "STG.E.64"]}
for _k in KERNELS:
    if _k.startswith("gemv_"):  # codebook from shared memory, addressed by prmt; 16-byte activation loads
        EXPECTED_SASS[_k] = ["PRMT", "LDS", "LDG.E.128.CONSTANT", "FFMA"]
    if _k.startswith("gemv_tq4_1s_fast"):  # int8 codebook by prmt from registers, dp4a, no shared-memory table
        EXPECTED_SASS[_k] = ["PRMT", "IDP.4A.S8.S8", "LOP3"]
    if _k.startswith("gemv_q8_0") and "_mma" not in _k:  # one prmt per word realigns the 2-byte-aligned block, dp4a, 16-byte Q8_1 loads
        EXPECTED_SASS[_k] = ["PRMT", "IDP.4A.S8.S8", "LDG.E.128.CONSTANT"]
    if _k in ("gemv_q4_k_t1", "gemv_q4_k_t2"):  # nibble → float by prmt into 2^23, FFMA
        EXPECTED_SASS[_k] = ["PRMT", "FFMA", "FADD", "LDG.E.128.CONSTANT"]
    if _k.startswith(("gemv_q4_k_fast", "gemv_q5_k_fast")):  # (5-bit) q as unsigned bytes x signed Q8_1; Σq_a: the prep's
        EXPECTED_SASS[_k] = ["IDP.4A.U8.S8", "LDG.E.128.CONSTANT", "LDG.E.64.CONSTANT"]
    if _k.startswith("gemv_q6_k_fast"):  # the 2-byte-aligned runs realigned by prmt, q - 32 as int8, dp4a, 16-byte Q8_1 loads
        EXPECTED_SASS[_k] = ["PRMT", "IDP.4A.S8.S8", "LDG.E.128.CONSTANT", "LDG.E.CONSTANT"]
    if _k.startswith("mmq_"):  # tensor cores fed by ldmatrix, weights by cp.async (LDGSTS), fp16 dequant
        EXPECTED_SASS[_k] = ["HMMA.16816.F32", "LDSM.16.M88.4", "LDGSTS.E.BYPASS.128", "HFMA2", "PRMT"]
    if _k.startswith("mmq_q4_k_wgmma"):  # TMA into an mbarrier ring, wgmma from swizzled shared memory
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "WARPGROUP.DEPBAR", "HFMA2"]
    if _k.startswith("mmq_q4_k_wgmma_ra"):  # as above, A from registers: no A tile stores, no proxy fence
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "WARPGROUP.DEPBAR", "HFMA2",
                             "SHFL.IDX"]
    if _k.startswith("mmq_q8_0_wgmma_ra"):  # Q8_0's quants decoded in the K loop: prmt into fp16, (h − 1152)·d
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "PRMT", "HMUL2", "HADD2"]
    if _k.startswith("mmq_q6_k_wgmma_ra"):  # Q6_K's 6-bit quants from 2-byte aligned boxes: prmt, two lop3, HMUL2
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "PRMT", "LOP3", "HMUL2"]
    if _k.startswith("mmq_tq4_1s_wgmma_ra"):  # TQ4_1S's codebook magnitudes by prmt, times ±d (HMUL2), by TMA
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "PRMT", "HMUL2"]
    if _k.startswith("mmq_q5_k_wgmma_ra"):  # Q4_K's nibble decode plus the fifth bits (lop3), by TMA
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "HFMA2", "SHFL.IDX", "LOP3"]
    if _k.startswith("mmq_q4_k_wgmma_pre"):  # A fragments loaded from the TMA ring (16-byte LDS), no dequant
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "WARPGROUP.DEPBAR", "LDS.128"]
    if _k.startswith("mmq_q4_k_wgmma_f16a"):  # fp16 A tiles by TMA too: the K loop is waits and wgmma, no decode
        EXPECTED_SASS[_k] = ["HGMMA.64x", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "WARPGROUP.DEPBAR"]
    if _k.startswith("mmq_q4_k_q8"):  # raw qs bytes by ldmatrix as u8 fragments, int8 tensor cores, cp.async
        EXPECTED_SASS[_k] = ["IMMA.16832.U8.S8", "LDSM.16.M88.4", "LDGSTS.E.BYPASS.128", "I2FP.F32.S32"]
    if _k.startswith("gemv_tq4_1s_tma"):  # weights by TMA into an mbarrier ring, lookups and FFMA as above
        EXPECTED_SASS[_k] = ["UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "PRMT", "LDS", "FFMA"]
for _t in (1, 2):  # the pair-table builds: one LDS.64 per qs byte (both of its weights' codebook values)
    EXPECTED_SASS[f"gemv_tq4_1s_tma_t{_t}"] = EXPECTED_SASS[f"gemv_tq4_1s_tma_t{_t}"] + ["LDS.64"]
# the product-table GEMV: the RHT by shfl butterflies, the table's stores, a prmt-addressed LDS per qs byte, the
# weights by TMA into an mbarrier ring
EXPECTED_SASS["gemv_tq4_1s_xt_t1"] = ["SHFL.BFLY", "STS", "PRMT", "LDS", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT",
                                      "FFMA", "BAR.SYNC"]
EXPECTED_SASS["gemv_tq4_1s_mma"] = ["HMMA.16816.F32", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "LDS"]
EXPECTED_SASS["gemv_tq4_1s_mma_m16"] = EXPECTED_SASS["gemv_tq4_1s_mma"]
EXPECTED_SASS["prep_tq4_1s_mma"] = ["SHFL.BFLY", "F2FP", "STG.E.U16"]
EXPECTED_SASS["prep_mma_f16"] = ["SHFL.BFLY", "F2FP", "STG.E.U16"]
for _p in ("prep_tq4_1s", "prep_tq4_1s_q8", "prep_q8_lanes", "prep_f32_lanes", "prep_tq4_1s_mma", "prep_mma_f16"):
    EXPECTED_SASS[_p + "_x16"] = EXPECTED_SASS[_p] + ["LDG.E.U16.CONSTANT"]  # the _x16 twins: 2-byte loads of fp16 x
EXPECTED_SASS["gemv_q4_k_mma"] = ["HMMA.16816.F32", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "HADD2"]
for _f in ("q6_k", "q8_0"):  # the codecs' tensor-core GEMV: bulk copies (_tma: one TMA box), HMMA, an L1 prefetch
    for _n in (f"gemv_{_f}_mma", f"gemv_{_f}_mma_n16"):
        EXPECTED_SASS[_n] = ["HMMA.16816.F32", "UBLKCP.S.G", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "CCTL.E.PF1"]
        EXPECTED_SASS[_n] += ["I2F.S8"] if _f == "q6_k" else []
    EXPECTED_SASS[f"gemv_{_f}_mma_tma"] = [("UTMALDG.2D" if s == "UBLKCP.S.G" else s) for s in EXPECTED_SASS[_n]]
EXPECTED_SASS["gemv_q4_k_mma_n16"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "HFMA2", "LDS"]  # cp.async everywhere
EXPECTED_SASS["gemv_q4_k_mma", "sm_89"] = EXPECTED_SASS["gemv_q4_k_mma_n16"]  # no TMA there: cp.async
for _sfx in ("t1", "t2", "t4", "t8", "t16h", "t32h"):
    EXPECTED_SASS[f"prep_q4k_{_sfx}"] = ["SHFL.BFLY", "F2FP", "STG.E.U16"]
    EXPECTED_SASS[f"gemv_q4_k_mma_{_sfx}"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "HFMA2", "LDS.128"]
    if _sfx != "t32h":  # Q5_K's builds: the same, the fifth bits placed by shifts and lop3
        EXPECTED_SASS[f"gemv_q5_k_mma_{_sfx}"] = EXPECTED_SASS[f"gemv_q4_k_mma_{_sfx}"] + ["LOP3"]
for _nt in (1, 2, 4, 8):  # Q6_K's and Q8_0's: the codec's integers (prmt, hadd2), one HMMA a sub-block, FFMA its scale;
    # Q6_K's 210-byte steps copied from 16 bytes below them (4-byte shared loads at both phases)
    EXPECTED_SASS[f"prep_sub16_t{_nt}"] = EXPECTED_SASS[f"prep_q4k_t{_nt}"]
    for _f in ("q6_k", "q8_0"):
        EXPECTED_SASS[f"gemv_{_f}_mma_t{_nt}"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "PRMT", "HADD2", "FFMA",
                                                  "LDS.128"]
    # TQ4_1S's: the rotation's shuffles in the prep; the codebook's hi / lo pairs by one LDS.64 a qs byte
    EXPECTED_SASS[f"prep_rot16_t{_nt}"] = EXPECTED_SASS[f"prep_q4k_t{_nt}"]
    EXPECTED_SASS[f"gemv_tq4_1s_mma_t{_nt}"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "PRMT", "LDS.64", "FFMA",
                                                "BAR.SYNC"]
EXPECTED_SASS["prep_sub16_t16h"] = EXPECTED_SASS["prep_q4k_t16h"]  # the codecs' 9-16-token builds: as the t8 ones
for _f in ("q6_k", "q8_0"):
    EXPECTED_SASS[f"gemv_{_f}_mma_t16h"] = EXPECTED_SASS[f"gemv_{_f}_mma_t8"]
# one launch: the t1 GEMV's SASS plus the prep's (shuffles, fp16 record stores) and the records' hand-off (the
# acquire invalidates L1, CCTL.IVALL, before the records are read through it)
for _nt in (1, 2, 4):  # (sm_89's ptxas names the reduction RED, sm_90a's and sm_120a's REDG)
    for _f in ("q4_k", "q5_k", "q6_k", "q8_0"):
        EXPECTED_SASS[f"gemv_{_f}_mma_t{_nt}_fused"] = EXPECTED_SASS[f"gemv_{_f}_mma_t{_nt}"] + [
            "SHFL.BFLY", "F2FP", "STG.E.U16", "ATOMG.E.ADD", "E.ADD.STRONG.GPU", "NANOSLEEP", "CCTL.IVALL"]
EXPECTED_SASS["mmq_q4_k_rega_n32"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "HFMA2", "BAR.SYNC"]
EXPECTED_SASS["mmq_q4_k_rega_n16"] = EXPECTED_SASS["mmq_q4_k_rega_n32"]
for _nt in (4, 8):  # the exact builds with the records shared by the CTA's warps: the skinny GEMM's ring
    EXPECTED_SASS[f"gemv_q4_k_mma_t{_nt}s"] = EXPECTED_SASS["mmq_q4_k_rega_n32"]
    EXPECTED_SASS[f"gemv_q5_k_mma_t{_nt}s"] = EXPECTED_SASS["mmq_q4_k_rega_n32"] + ["LOP3"]
    for _f in ("q6_k", "q8_0"):  # the codecs' integers (prmt, hadd2), their scales in fp32, the ring's CTA barrier
        EXPECTED_SASS[f"gemv_{_f}_mma_t{_nt}s"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "PRMT", "HADD2", "FFMA",
                                                   "BAR.SYNC"]
    EXPECTED_SASS[f"gemv_tq4_1s_mma_t{_nt}s"] = ["HMMA.16816.F32", "LDGSTS.E.BYPASS.128", "PRMT", "LDS.64", "FFMA",
                                                 "BAR.SYNC"]
EXPECTED_SASS["mmq_q5_k_rega_n32"] = EXPECTED_SASS["mmq_q4_k_rega_n32"] + ["LOP3"]
for _nt in (1, 2, 4, 8):  # the int8 builds: nibbles by ldmatrix into u8 x s8 MMAs, scales on the integer sums;
    # their prep's digit planes as byte stores
    EXPECTED_SASS[f"gemv_q4_k_i8_t{_nt}"] = ["IMMA.16832.U8.S8", "LDSM.16.M88.4", "LDGSTS.E.BYPASS.128", "I2FP.F32.S32",
                                             "HMMA.16816.F32"]
    EXPECTED_SASS[f"prep_q4k_i8_t{_nt}"] = ["SHFL.BFLY", "F2I", "STG.E.U8", "STG.E.U16"]
    EXPECTED_SASS[f"gemv_q4_k_i8_t{_nt}_fused"] = EXPECTED_SASS[f"gemv_q4_k_i8_t{_nt}"] + ["STG.E.U8", "ATOMG"]
    EXPECTED_SASS[f"gemv_q5_k_i8_t{_nt}"] = EXPECTED_SASS[f"gemv_q4_k_i8_t{_nt}"] + ["LOP3"]  # (+ the fifth bits)
    EXPECTED_SASS[f"gemv_q5_k_i8_t{_nt}_fused"] = EXPECTED_SASS[f"gemv_q4_k_i8_t{_nt}_fused"]
    # Q6_K's: a bit select a sub-block into m16n8k16 u8 x s8, its scales sign-extended by PRMT, the −32 by an HMMA
    EXPECTED_SASS[f"gemv_q6_k_i8_t{_nt}"] = ["IMMA.16816.U8.S8", "LDGSTS.E.BYPASS.128", "I2FP.F32.S32", "HMMA.16816.F32",
                                             "PRMT", "LOP3"]
    EXPECTED_SASS[f"prep_q6k_i8_t{_nt}"] = EXPECTED_SASS[f"prep_q4k_i8_t{_nt}"]
    # Q8_0's: its int8 quants as they lie into m16n8k16 s8 x s8, its block scales by FFMA, the non-finite check's HMMA
    EXPECTED_SASS[f"gemv_q8_0_i8_t{_nt}"] = ["IMMA.16816.S8.S8", "LDGSTS.E.BYPASS.128", "I2FP.F32.S32",
                                             "HMMA.16816.F32", "FFMA"]
    EXPECTED_SASS[f"gemv_q8_0_i8_t{_nt}_fused"] = EXPECTED_SASS[f"gemv_q8_0_i8_t{_nt}"] + ["STG.E.U8", "ATOMG"]
    EXPECTED_SASS[f"gemv_q6_k_i8_t{_nt}_fused"] = EXPECTED_SASS[f"gemv_q6_k_i8_t{_nt}"] + ["STG.E.U8", "ATOMG"]
for _nt in (1, 2, 4, 8):  # the preps on fp16 x: each value by a 2-byte load, widened (the fp32 builds' SASS besides)
    for _p in ("q4k", "sub16", "q4k_i8", "q6k_i8"):
        EXPECTED_SASS[f"prep_{_p}_t{_nt}_x16"] = EXPECTED_SASS[f"prep_{_p}_t{_nt}"] + ["LDG.E.U16.CONSTANT"]
for _sfx in ("t16h", "t32h"):
    EXPECTED_SASS[f"prep_q4k_{_sfx}_x16"] = EXPECTED_SASS[f"prep_q4k_{_sfx}"] + ["LDG.E.U16.CONSTANT"]
EXPECTED_SASS["prep_sub16_t16h_x16"] = EXPECTED_SASS["prep_sub16_t16h"] + ["LDG.E.U16.CONSTANT"]
for _n in [n for n in list(EXPECTED_SASS) if isinstance(n, str) and n.endswith("_fused") and n + "_x16" in KERNELS]:
    EXPECTED_SASS[_n + "_x16"] = EXPECTED_SASS[_n] + ["LDG.E.U16.CONSTANT"]  # the one-launch builds' fp16-x twins
EXPECTED_SASS["dequantize_q4_k_frags"] = ["F2FP", "LDG.E.64.CONSTANT", "STG.E.128"]  # fragment-ordered 16-byte stores
EXPECTED_SASS["moe_group"] = ["ATOMS.", "BAR.SYNC", "STG.E"]  # shared-memory atomics count and place the pairs
EXPECTED_SASS["moe_check_ids"] = ["LDG.E.CONSTANT", "E.ADD.STRONG.GPU"]  # one id a thread; ptxas aggregates a warp's
# reductions (RED.E.ADD on sm_89, REDG.E.ADD from sm_90)
EXPECTED_SASS["mul_mat_fixup_q4_k"] = ["ATOMG.E.ADD", "LDG.E.128.CONSTANT", "FFMA", "SHFL.BFLY", "BAR.SYNC"]
# the other codecs' dequantize: 2-byte loads where blocks are only 2-byte aligned (Q6_K, Q8_0), 16-byte stores for
# Q8_0's runs of 8
EXPECTED_SASS["dequantize_q5_k"] = ["F2FP", "LDG.E.CONSTANT", "STG.E.64"]
EXPECTED_SASS["dequantize_q6_k"] = ["F2FP", "LDG.E.U16.CONSTANT", "LDG.E.S8.CONSTANT", "I2FP.F32.S32"]
EXPECTED_SASS["dequantize_q8_0"] = ["F2FP", "LDG.E.U16.CONSTANT", "STG.E.128"]
for _f in ("q5_k", "q6_k", "q8_0"):  # the codec GEMV: the codec's decode, one FFMA per weight, a shuffle sum
    for _t in (1, 2, 4, 8, 16):
        EXPECTED_SASS[f"gemv_{_f}_f32_t{_t}"] = ["FFMA", "SHFL.BFLY", "LDG.E.128.CONSTANT"] + (
            ["LDG.E.U16.CONSTANT", "PRMT"] if _f == "q6_k" else [])  # Q6_K's wide lanes: 2-byte loads paired
EXPECTED_SASS["gemv_q4_k_f32_t1"] = EXPECTED_SASS["gemv_q5_k_f32_t1"]  # (route small_gemv: the same lanes less qh)
for _f in ("q4_k", "q5_k", "q6_k", "q8_0"):  # on fp16 x: 8-byte loads of 4 values, each widened (HADD2.F32)
    EXPECTED_SASS[f"gemv_{_f}_f32_t1_x16"] = [s for s in EXPECTED_SASS[f"gemv_{_f}_f32_t1"]
                                              if s != "LDG.E.128.CONSTANT"] + ["LDG.E.64.CONSTANT", "HADD2.F32"]
EXPECTED_SASS["gemv_q6_k_f32_t8"] = ["FFMA", "SHFL.BFLY", "LDG.E.64.CONSTANT", "LDG.E.U16.CONSTANT", "I2FP.F32.S32"]  # 8-weight
# lanes there (gemv_codec.TUNED): runs of 2, x by 8-byte loads
for _f in ("q5_k", "q6_k", "q8_0"):  # the multi-token builds on fp16 x: each value widened (HADD2.F32)
    for _t in (2, 4, 8, 16):
        if f"gemv_{_f}_f32_t{_t}_x16" in KERNELS:
            EXPECTED_SASS[f"gemv_{_f}_f32_t{_t}_x16"] = [s for s in EXPECTED_SASS[f"gemv_{_f}_f32_t{_t}"]
                                                         if not s.startswith("LDG.E.")] + ["HADD2.F32"]
for _f in ("q4_k", "q5_k", "q6_k", "q8_0", "tq4_1s"):  # mul_mat_id's GEMV: the codec's decode, a shuffle sum, NaN for a bad id
    EXPECTED_SASS[f"gemv_{_f}_f32_id"] = ["FFMA", "SHFL.BFLY", "FSEL"]
    EXPECTED_SASS[f"gemv_{_f}_f32_idg"] = ["FFMA", "SHFL.BFLY", "SHFL.UP", "STS", "LDS", "FSEL"]  # the expert's pairs
for _f in ("q5_k", "q6_k", "q8_0", "tq4_1s"):  # the prepared GEMM's fragments from any codec: 16-byte stores
    EXPECTED_SASS[f"dequantize_{_f}_frags"] = ["F2FP", "STG.E.128", "FMUL"]
for _f in ("q5_k", "q6_k", "q8_0", "tq4_1s"):  # the codec fixups: the flag, an arrival count, fp32 row sums
    EXPECTED_SASS[f"mul_mat_fixup_{_f}"] = ["ATOMG.E.ADD", "FFMA", "SHFL.BFLY", "BAR.SYNC"]
EXPECTED_SASS["convert_f16"] = ["F2FP", "LDG.E.128.CONSTANT", "STG.E.128"]
# the register-A K order: a group by 16-byte loads as it lies, into place by a quad transpose, one 16-byte store
EXPECTED_SASS["convert_f16_perm"] = ["F2FP", "LDG.E.128.CONSTANT", "SHFL.BFLY", "STG.E.128"]
EXPECTED_SASS["permute_f16"] = ["LDG.E.128.CONSTANT", "PRMT", "SHFL.BFLY", "STG.E.128"]  # (fp16 x)
EXPECTED_SASS["convert_f32"] = ["LDG.E.128.CONSTANT", "HADD2.F32", "STG.E.128"]
EXPECTED_SASS["copy_f16"] = ["LDG.E.128.CONSTANT", "STG.E.128"]  # (one 16-byte load and store a thread)
EXPECTED_SASS["moe_gather"] = ["ATOMS.", "BAR.SYNC", "F2FP", "LDG.E.128.CONSTANT", "SHFL.BFLY", "STG.E.128"]  # grouping,
# 2 16-byte loads a group, the quad's transpose and one 16-byte store
EXPECTED_SASS["moe_gather_sums"] = EXPECTED_SASS["moe_gather"] + ["STG.E.U16"]  # + Σx
for _n in ("moe_gather", "moe_gather_sums"):  # on fp16 x: a group by one 16-byte load, widened, rounded back
    EXPECTED_SASS[_n + "_x16"] = EXPECTED_SASS[_n]
for _n in [n for n in list(EXPECTED_SASS) if isinstance(n, str) and n.endswith(("_f32_id", "_f32_idg"))
           and n + "_x16" in KERNELS]:  # the MoE GEMVs on fp16 x: 2-byte values widened as they are loaded
    EXPECTED_SASS[_n + "_x16"] = EXPECTED_SASS[_n] + ["HADD2.F32"]
# sm_120a's fp16 mma.sync MMQ: the weights (and the x16 builds' fp16 x) by TMA into an mbarrier ring, no cp.async
ABSENT_SASS = {}
for _k in KERNELS:
    if _k.startswith("mmq_q4_k_f16_") and _k.endswith("_moe"):  # the grouped MoE GEMM: cp.async on every target
        EXPECTED_SASS[_k] = ["HMMA.16816.F32", "LDSM.16.M88.4", "LDGSTS.E.BYPASS.128", "HFMA2", "PRMT"]
    elif ("_wgmma_ra_" in _k or "_wgmma_iw_" in _k) and _k.endswith("_moe"):  # sm_90's: the codec's register-A
        # wgmma K loop (its dense build's SASS; integer weights: y += d·acc in fp32), y scattered by pair (4-byte
        # stores), no cp.async
        EXPECTED_SASS[_k] = EXPECTED_SASS[_k] + ["STG.E"] + (["FFMA"] if "_iw_" in _k else [])
        ABSENT_SASS[_k, "sm_90a"] = ["LDGSTS", "STG.E.128"]
    elif _k.startswith("mmq_") and _k.endswith("_moe"):  # the other codecs': run8 from global memory, to fp16
        EXPECTED_SASS[_k] = ["HMMA.16816.F32", "LDSM.16.M88.4", "LDG.E", "F2FP.F16.F32.PACK"]
        ABSENT_SASS[_k, "sm_90a"] = ["LDGSTS"]
    elif _k.startswith("mmq_") and "_f16_" in _k and not _k.startswith("mmq_q4_k"):  # the codecs' dense mma.sync
        # GEMM: run8 from global memory to fp16 (cp.async only for the _x16 builds' fp16 x), on both targets alike
        EXPECTED_SASS[_k] = ["HMMA.16816.F32", "LDSM.16.M88.4", "LDG.E", "F2FP.F16.F32.PACK"]
    elif _k.startswith("mmq_q4_k_f16_"):
        EXPECTED_SASS[_k, "sm_120a"] = ["HMMA.16816.F32", "LDSM.16.M88.4", "UTMALDG.2D", "SYNCS.PHASECHK.TRANS64.TRYWAIT",
                                        "HFMA2", "PRMT"]
        ABSENT_SASS[_k, "sm_120a"] = ["LDGSTS"]
for _t in (1, 2, 4):  # Q6_K's wide lanes: q − 32 by a PRMT and an FADD, no quarter-rate I2F a weight
    ABSENT_SASS[f"gemv_q6_k_f32_t{_t}", "sm_90a"] = ["I2F.S8"]
ABSENT_SASS["mmq_q4_k_wgmma_f16a_n256", "sm_90a"] = ["HFMA2", "LDS.128"]  # no decode, no A fragments from the ring
ABSENT_SASS["mmq_q4_k_wgmma_f16a_n256_cx", "sm_90a"] = ["HFMA2"]  # (its converters read their staging by LDS)


# the fast tier reads the SASS of the sm_90a builds, of the kernels built only for the mma.sync targets on sm_89,
# and of sm_120a's own lowering of the fp16 mma.sync MMQ (its TMA ring) at n32; the slow tier every build
SASS_FAST = [(k, a) for k, a in CASES if a == "sm_90a" or (a == "sm_89" and "sm_90a" not in KERNELS[k].archs)]
SASS_FAST += [("mmq_q4_k_f16_n32", "sm_120a"), ("mmq_q4_k_f16_n32_x16", "sm_120a")]


@pytest.mark.parametrize("kernel,arch", [c if c in SASS_FAST else pytest.param(*c, marks=pytest.mark.slow)
                                         for c in CASES])
def test_sass(kernel, arch):
    k = KERNELS[kernel].for_arch(arch)
    text = sass(_compile(k, arch, kernel).cubin)
    for op in EXPECTED_SASS.get((kernel, arch), EXPECTED_SASS[kernel]):
        assert op in text, f"{kernel}/{arch}: {op} missing from SASS"
    for op in ABSENT_SASS.get((kernel, arch), ()):
        assert op not in text, f"{kernel}/{arch}: {op} in SASS"
    if get_arch(arch).allowed_stack(k.ptx()):  # sm_120a's TMA frame: ptxas zeroes it (STL.64 [R1], RZ), no more
        text = "\n".join(line for line in text.splitlines() if "STL.64 [R1], RZ" not in line)
    assert "LDL" not in text and "STL" not in text, "local memory in SASS"


@pytest.mark.parametrize("feature,arch,op", [("mma_sync_f16", "sm_89", "HMMA.16816.F32"),
                                             ("mma_sync_s8", "sm_89", "IMMA.16832.S8.S8"),
                                             ("wgmma", "sm_90a", "HGMMA.64x8x16.F32"),
                                             ("cp_async_bulk_tensor", "sm_90a", "UTMALDG"),
                                             ("cp_async", "sm_89", "LDGSTS"),
                                             ("mma_sync_f16", "sm_120a", "HMMA.16816.F32")])
def test_tensor_core_probes_lower_to_the_intended_sass(feature, arch, op):
    text = sass(compile_ptx(probe_ptx(get_arch(arch), feature), arch, name=f"probe_{feature}").cubin)
    assert op in text


def test_cli_errors_and_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["emit", "--arch", "sm_70"])
    assert e.value.code == 2 and "valid: sm_89, sm_90a, sm_120a" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["emit", "--kernel", "dequantize_q4k"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "did you mean dequantize_q4_k" in err and "ptxgen list" in err
    assert main(["list"]) == 0 and "dequantize_q4_k" in capsys.readouterr().out


def test_cli_names_the_reason_a_kernel_is_not_built_for_an_arch(capsys, tmp_path):
    """Asking for wgmma on sm_120a (or TMA on sm_89) by name is an error that says why, not 0 kernels
    emitted; naming only the kernel emits it where it exists and notes the other targets."""
    with pytest.raises(SystemExit) as e:
        main(["emit", "--arch", "sm_120a", "--kernel", "mmq_q4_k_wgmma_n64", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "mmq_q4_k_wgmma_n64 is not built for sm_120a" in err and "no wgmma" in err
    with pytest.raises(SystemExit) as e:
        main(["check", "--arch", "sm_89", "--kernel", "gemv_tq4_1s_tma_t1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "cp_async_bulk_tensor" in err and "sm_89" in err
    assert main(["emit", "--kernel", "gemv_tq4_1s_tma_t1", "-o", str(tmp_path / "o"), "-q"]) == 0
    assert "note: gemv_tq4_1s_tma_t1 is not built for sm_89" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["sm_120a", "sm_90a"]  # the TMA targets
    assert (tmp_path / "o" / "sm_90a" / "gemv_tq4_1s_tma_t1.ptx").exists()


def test_cli_emit_and_check_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ptxgen.cli", "emit", "--arch", "sm_89", "-o", str(tmp_path)],
                         capture_output=True, text=True, check=True)
    assert (tmp_path / "quantize_q8_1.ptx").exists() and "sm_89" in out.stdout
    chk = subprocess.run([sys.executable, "-m", "ptxgen.cli", "check", "--arch", "sm_120a"], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    assert "dequantize_q4_k" in chk.stdout and "SPILLS" not in chk.stdout


def test_cli_emit_of_one_kernel_keeps_the_other_manifest_entries(tmp_path):
    """`ptxgen emit --kernel X` rewrites X's file and manifest entry only: the other kernels' entries stay, in
    their order, so emitting a subset into emitted/ never drops the rest of the manifest."""
    import json
    import shutil

    golden = REPO / "emitted" / "sm_89" / "manifest.json"
    shutil.copy(golden, tmp_path / "manifest.json")
    assert main(["emit", "--arch", "sm_89", "--kernel", "quantize_q8_1", "-o", str(tmp_path), "-q"]) == 0
    assert json.loads((tmp_path / "manifest.json").read_text()) == json.loads(golden.read_text())
    assert [p.name for p in tmp_path.glob("*.ptx")] == ["quantize_q8_1.ptx"]


def test_hot_loop_finds_the_innermost_loop_with_the_hottest_op():
    from ptxgen.runtime.compiler import hot_loop

    text = "\n".join([
        ".L_x_0:", "        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;",
        ".L_x_1:", "        /*0010*/                   FFMA R2, R2, R3, R4 ;",
        "        /*0020*/               @P0 BRA `(.L_x_1) ;",
        ".L_x_2:", "        /*0030*/                   HMMA.16816.F32 R4, R8, R12, R4 ;",
        "        /*0040*/                   LDSM.16.M88.4 R8, [R2] ;",
        "        /*0050*/               @!P1 BRA `(.L_x_2) ;",
        "        /*0060*/               @P2 BRA `(.L_x_0) ;"])
    loop = hot_loop(text)
    assert loop == {"instructions": 3, "ops": {"HMMA.16816.F32": 1, "LDSM.16.M88.4": 1, "BRA": 1}, "marker": "HMMA"}
    assert hot_loop(text.replace("HMMA.16816.F32", "MOV")) ["marker"] == "FFMA"
    assert hot_loop("        /*0000*/                   EXIT ;") is None


@pytest.mark.parametrize("kernel,arch,op,per_iteration", [
    ("mmq_q4_k_q8_n16", "sm_89", "IMMA.16832.U8.S8.SAT", 4),  # warp tile 16x16, 2 sub-blocks per 64-K step
    ("mmq_q4_k_f16_n128", "sm_89", "HMMA.16816.F32", 64),  # 4 m16 x 4 n8 x 4 k16 per step
    ("mmq_q4_k_f16_n128_x16", "sm_89", "HMMA.16816.F32", 64),  # the same tile on fp16 x
    ("mmq_q4_k_f16_n128_x16", "sm_120a", "HMMA.16816.F32", 64),  # its TMA ring: the stage waits are loops too
    ("mmq_q4_k_wgmma_n256", "sm_90a", "HGMMA.64x256x16.F32", 4),  # 4 k16 per 64-K step
    ("mmq_q4_k_wgmma_ra_n192", "sm_90a", "HGMMA.64x192x16.F32", 8)])  # 2 steps per iteration (A register sets)
def test_main_loop_of_the_mmqs_holds_their_mma_count(kernel, arch, op, per_iteration):
    """`ptxgen check --loops` reads the main loop from SASS: it must be the K-step loop (its MMA count is the
    tile's, from the description) — the number a prediction of the kernel's issue time starts from."""
    from ptxgen.runtime.compiler import hot_loop

    k = KERNELS[kernel].for_arch(arch)
    loop = hot_loop(sass(compile_ptx(k.ptx(), arch, name=kernel).cubin))
    assert loop is not None and sum(n for o, n in loop["ops"].items() if o.startswith(op)) == per_iteration, loop


def test_cli_version_help_and_unbuilt_arch(capsys):
    from ptxgen import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"ptxgen {__version__}"
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "{emit,list,check,bench}" in out and "python -m ptxgen.emu --help" in out
    with pytest.raises(SystemExit) as e:
        main(["emit", "--arch", "sm_80"])
    assert e.value.code == 2 and "no kernels are built for sm_80" in capsys.readouterr().err


def test_cli_output_into_a_closed_pipe_is_not_an_error():
    """`ptxgen list | head -1`: the reader leaves early; ptxgen exits 0 without a traceback."""
    p = subprocess.run(f"{sys.executable} -m ptxgen.cli list | head -1", shell=True, capture_output=True, text=True)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_emulator_cli_reports_errors_in_one_line(tmp_path):
    def emu(*args):
        return subprocess.run([sys.executable, "-m", "ptxgen.emu", *args], capture_output=True, text=True)

    p = emu("quantize_q8_1", "--ptx", str(tmp_path / "missing.ptx"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "cannot read" in p.stderr
    p = emu("no_such_kernel")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no emulator harness" in p.stderr
    bad = tmp_path / "bad.ptx"
    bad.write_text(ptx_of("quantize_q8_1").replace("mul.rn.f32", "frob.rn.f32", 1))
    p = emu("quantize_q8_1", "--ptx", str(bad))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    p = emu("--help")
    assert p.returncode == 0 and "Exit codes" in p.stdout
    p = emu("quantize_q8_1")
    assert p.returncode == 0 and "OK" in p.stdout


def ptx_of(kernel: str, arch: str = "sm_89") -> str:
    return KERNELS[kernel].for_arch(arch).ptx()


def test_ctas_per_sm_never_claims_more_shared_memory_than_the_target_has():
    """Every build's meta ctas_per_sm (the runtime's grid and split plans read it) fits the target's shared memory
    per SM (opt-in limit + 1 KB; 1 KB more per CTA): sm_89 and sm_120a builds of kernels tuned on the H200 say so."""
    for arch in TARGETS:
        a = get_arch(arch)
        for e in json.loads((REPO / "emitted" / arch / "manifest.json").read_text())["kernels"]:
            c, smem = e["meta"].get("ctas_per_sm"), e["static_smem"] + e["dynamic_smem"]
            if isinstance(c, int) and smem:
                assert c == 1 or c * (smem + 1024) <= a.max_smem_per_block + 1024, (arch, e["kernel"], c, smem)


def test_codec_gemv_residency_sets_launch_bounds_without_spills(monkeypatch):
    """gemv_codec.RESIDENCY (launch bounds by kernel name): an entry asks ptxas for that many
    resident CTAs (.minnctapersm, meta ctas_per_sm), and the MoE pair GEMV fits 4 an SM (64 registers) unspilled."""
    from ptxgen.kernels import gemv_codec

    monkeypatch.setattr(gemv_codec, "RESIDENCY", {"gemv_q4_k_f32_id": 4})
    k = KERNELS["gemv_q4_k_f32_id"].for_arch("sm_90a")
    assert ".minnctapersm 4" in k.ptx() and k.meta["ctas_per_sm"] == 4
    r = compile_ptx(k.ptx(), "sm_90a", name=k.name).resources[k.entry]
    assert r["registers"] <= 64 and r["spill_stores"] == r["spill_loads"] == r["lmem"] == 0
    assert ".minnctapersm" not in KERNELS["gemv_q6_k_f32_t1"].for_arch("sm_90a").ptx()


def test_codec_gemv_shipped_residency_compiles_unspilled():
    """The shipped RESIDENCY entries hold: each build asks its CTAs an SM and ptxas fits them without spills."""
    from ptxgen.kernels import gemv_codec

    assert gemv_codec.RESIDENCY
    for name, ctas in gemv_codec.RESIDENCY.items():
        k = KERNELS[name].for_arch("sm_90a")
        assert f".minnctapersm {ctas}" in k.ptx() and k.meta["ctas_per_sm"] == ctas
        r = compile_ptx(k.ptx(), "sm_90a", name=k.name).resources[k.entry]
        assert r["spill_stores"] == r["spill_loads"] == r["lmem"] == 0, (name, r)
        assert r["registers"] * k.threads * ctas <= 65536, (name, r)


@pytest.mark.parametrize("spec", [dict(fmt="q4_K"), dict(fmt="q8_0"), dict(fmt="q6_K", stream=True),
                                  dict(fmt="q6_K", convert=True), dict(fmt="q6_K", prepared=True)])
def test_row_groups_are_refused_where_they_are_not_built(spec):
    """MmqSpec.row_group (kernels/mmq.py ROW_GROUP_NOTE) is lowered for Q6_K's register-A builds on their byte boxes
    (dense, cluster split, MoE) only: another codec (Q4_K's columns, Q8_0's word boxes) or schedule would build
    without the groups in its loads and with them in its epilogue — refused by name instead."""
    from ptxgen.kernels import mmq
    from ptxgen.specs import MmqSpec

    s = MmqSpec(256 if spec.get("stream") else 64, "wgmma", a_regs=True, row_group=8, **spec)
    with pytest.raises(ValueError, match="row groups"):
        mmq.build("sm_90a", s)
