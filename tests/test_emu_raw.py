"""The emulator tier on drawn GGUF bytes: one representative build of each kernel family, for every format, run on
weights the hypothesis strategies draw byte by byte (ptxgen.testing.strategies.raw_matrix: any payload bytes, the
fp16 scale fields from the finite halves, an edge value pinned in one block) instead of the quantizer's output.
Everything else is the emulator harness's own runner (ptxgen.emu.harness: the shapes, x, ids, splits and the bound
each kernel's own emulator test uses); only the weights come from elsewhere: the runner's
`formats.quantize(<fmt>, ...)` and `random_raw(<fmt>, ...)` return the drawn blocks (`drawn_weights`).

Which scales. A kernel that keeps the scales in fp32 — the decode GEMVs, the tensor-core and few-token GEMVs
(integer q·sc in the MMA, d applied in fp32), the 16-token and skinny builds (fp16 activations, the same integer
weights), the MoE GEMVs, the fragment and dequantize passes (bit for bit, an fp16 overflow included) — takes every
finite fp16 scale: its fp32 sums stay finite (|w| ≤ 65504·4096 for Q6_K, times |x| ≤ ~200 over K ≤ 4096: ~1e17).
A kernel that holds each weight in fp16 — the prefill GEMMs (mma.sync fp16, register-A wgmma, prepared) and the
grouped MoE GEMMs (Q4_K's integer-weight build too: its −dmin·m is fp16) — takes scales up to
strategies.fp16_weight_scale(fmt), the largest for which every weight the format can express fits in fp16: past
it such a GEMM's weight is inf where float64's is finite, whatever the kernel, and mul_mat's fixup (which tests x,
not the weights) leaves the inf / NaN outputs (`test_largest_weights_*` runs the largest weights there are at the
bound).

Tiers: a few formats x families in the default tier (one example each); every format x family in the slow tier."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ptxgen import formats
from ptxgen.arch import get_arch
from ptxgen.emu import harness
from ptxgen.kernels import KERNELS
from ptxgen.testing import blocks, strategies as S

ANY, FP16 = "any finite scale", "fp16 weights"  # the scales a family takes (module docstring)
WEIGHT_FORMATS = ("q4_K", "q5_K", "q6_K", "q8_0", "tq4_1s")

# (family, format, kernel, scales): one build a family and format, the one mul_mat / mul_mat_id dispatch on sm_90a
# where there is a choice (the mma.sync builds: sm_89's)
CASES = [
    ("decode GEMV", "q4_K", "gemv_q4_k_t1", ANY),
    ("decode GEMV", "q5_K", "gemv_q5_k_f32_t2", ANY),
    ("decode GEMV", "q5_K", "gemv_q5_k_f32_t16", ANY),
    ("decode GEMV", "q6_K", "gemv_q6_k_f32_t1", ANY),
    ("decode GEMV", "q8_0", "gemv_q8_0_f32_t1", ANY),
    ("decode GEMV", "tq4_1s", "gemv_tq4_1s_t1", ANY),
    *[("int8 lane GEMV (mode fast)", f, n, ANY) for f, n in (("q4_K", "gemv_q4_k_fast_t1"), ("q5_K", "gemv_q5_k_fast_t2"),
                                                            ("q6_K", "gemv_q6_k_fast_t1"), ("q8_0", "gemv_q8_0_t4"))],
    ("tensor-core decode GEMV", "q4_K", "gemv_q4_k_mma", ANY),
    ("tensor-core decode GEMV", "q6_K", "gemv_q6_k_mma_tma", ANY),
    ("tensor-core decode GEMV", "q8_0", "gemv_q8_0_mma_tma", ANY),
    ("tensor-core decode GEMV", "tq4_1s", "gemv_tq4_1s_mma_m16", ANY),
    ("tensor-core decode GEMV, bulk copies", "q6_K", "gemv_q6_k_mma", ANY),  # (rows not 16-byte multiples)
    ("tensor-core decode GEMV, bulk copies", "q8_0", "gemv_q8_0_mma", ANY),
    ("few-token GEMV", "q4_K", "gemv_q4_k_mma_t1_fused", ANY),
    ("few-token GEMV", "q5_K", "gemv_q5_k_mma_t1_fused", ANY),
    ("few-token GEMV", "q6_K", "gemv_q6_k_mma_t1", ANY),
    ("few-token GEMV", "q8_0", "gemv_q8_0_mma_t2", ANY),
    ("16-token GEMV", "q4_K", "gemv_q4_k_mma_t16h", ANY),
    ("16-token GEMV", "q5_K", "gemv_q5_k_mma_t16h", ANY),
    ("16-token GEMV", "q6_K", "gemv_q6_k_mma_t16h", ANY),
    ("16-token GEMV", "q8_0", "gemv_q8_0_mma_t16h", ANY),
    ("skinny GEMM", "q4_K", "mmq_q4_k_rega_n32", ANY),
    ("skinny GEMM", "q5_K", "mmq_q5_k_rega_n32", ANY),
    *[("register-A GEMM", f, f"mmq_{f.lower()}_wgmma_ra_n64", FP16) for f in WEIGHT_FORMATS],
    *[("register-A GEMM converting x", f, f"mmq_{f.lower()}_wgmma_ra_n64_cx", FP16) for f in ("q4_K", "q5_K", "q8_0")],
    ("register-A GEMM on row groups", "q6_K", "mmq_q6_k_wgmma_ra_n64_g8", FP16),  # (K whose rows miss 16 bytes)
    *[("mma.sync GEMM", f, f"mmq_{f.lower()}_f16_n32", FP16) for f in WEIGHT_FORMATS],
    *[("fragment pass", f, f"dequantize_{f.lower()}_frags", ANY) for f in WEIGHT_FORMATS],
    *[("prepared GEMM", f, "mmq_q4_k_wgmma_pre_n256", FP16) for f in WEIGHT_FORMATS],
    *[("dequantize", f, f"dequantize_{f.lower()}", ANY) for f in ("q4_K", "q5_K", "q6_K", "q8_0")],
    *[("MoE GEMV", f, f"gemv_{f.lower()}_f32_id", ANY) for f in WEIGHT_FORMATS],
    *[("grouped MoE GEMV", f, f"gemv_{f.lower()}_f32_idg", ANY) for f in WEIGHT_FORMATS],
    *[("grouped MoE GEMM", f, f"mmq_{f.lower()}_wgmma_ra_n32_moe", FP16) for f in WEIGHT_FORMATS],
    ("grouped MoE GEMM", "q4_K", "mmq_q4_k_wgmma_iw_n16_moe", FP16),
    ("grouped MoE GEMM on row groups", "q6_K", "mmq_q6_k_wgmma_ra_n32_g8_moe", FP16),
    *[("mma.sync grouped MoE GEMM", f, f"mmq_{f.lower()}_f16_n32_moe", FP16) for f in WEIGHT_FORMATS],
]
# the default tier's few: Q5_K, Q6_K and Q8_0 through a decode GEMV (every finite scale), their sm_90 prefill GEMM
# (fp16 weights) and a MoE GEMV; ~10 s on one core
SMOKE = [c for c in CASES if c[1] in ("q5_K", "q6_K", "q8_0") and (
    c[0] in ("register-A GEMM", "grouped MoE GEMV") or c[2] in ("gemv_q5_k_f32_t2", "gemv_q6_k_f32_t1",
                                                               "gemv_q8_0_f32_t1"))]


class _DrawnWeights:
    """Stands in for ptxgen.formats inside the harness while a runner runs: quantize(fmt, w) of the format under
    test returns `draw(fmt, *w.shape)` (raw blocks of w's shape) instead of w quantized; the rest (the references,
    Q8_1) is formats' own."""

    def __init__(self, fmt: str, draw):
        self.fmt, self._draw, self.draws = fmt, draw, 0

    def draw(self, fmt, m, k):
        self.draws += 1
        return self._draw(fmt, m, k)

    def quantize(self, name, x, **kw):
        if name != self.fmt:
            return formats.quantize(name, x, **kw)
        m, k = np.shape(x)
        return self.draw(name, m, k)

    def __getattr__(self, name):
        return getattr(formats, name)


@contextlib.contextmanager
def drawn_weights(fmt: str, draw):
    """While inside: the harness's runners take their `fmt` weights from draw(fmt, m, k) (a uint8 (m, row bytes)
    array of raw blocks) wherever they would quantize or draw random_raw blocks. Yields the stand-in: `.draws`
    counts the weights drawn (a runner that took none would not test the drawn blocks)."""
    weights = _DrawnWeights(fmt, draw)

    def random_raw(f, m, k, rng, scale=None):
        assert f == fmt, (f, fmt)
        return weights.draw(f, m, k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(harness, "formats", weights)
        mp.setattr(S, "random_raw", random_raw)
        mp.setattr(blocks, "random_raw", random_raw)  # (the runners import it from here when they run)
        yield weights


def _run(fmt: str, kernel: str, seed: int):
    """The kernel's emulator runner on its build for sm_90a (else its first target), under drawn_weights. The
    runners that bind random_raw when the harness is built (fragments, dequantize) are built afresh; the prepared
    GEMM (one build, named for Q4_K, for every codec's fragments) takes the format in its meta."""
    k = KERNELS[kernel]
    arch = "sm_90a" if "sm_90a" in k.archs else k.archs[0]
    built = k.for_arch(get_arch(arch))
    rng = np.random.default_rng(seed)
    if kernel.endswith("_frags"):
        return harness._frags(fmt)(built.ptx(), rng, seed=seed)
    if kernel.startswith("dequantize_"):
        return harness._deq(fmt)(built.ptx(), rng, seed=seed)
    if "_pre_" in kernel:  # M past a tile, two token tiles, K of two super-blocks (no raw-row alignment needed)
        meta = dict(built.meta, name=kernel, fmt=fmt)
        return harness.mmq_wgmma_case(built.ptx(), meta, rng, shape=(131, 261, 512), seed=seed)
    return harness.check_kernel(kernel, built.ptx(), seed=seed)


def _check_drawn(data, family, fmt, kernel, scales):
    bound = None if scales == ANY else S.fp16_weight_scale(fmt)
    seed = data.draw(st.integers(0, 2**16), label="runner seed")

    def draw(f, m, k):
        return data.draw(S.raw_matrix(f, m, k, max_abs_scale=bound), label=f"{f} raw blocks ({m}, {k})")
    with drawn_weights(fmt, draw) as weights:
        out = _run(fmt, kernel, seed)
    assert weights.draws == 1 and out.ok, f"{family}: {out.detail} ({weights.draws} weights drawn)"


@pytest.mark.parametrize("family,fmt,kernel,scales", SMOKE, ids=[c[2] for c in SMOKE])
@settings(max_examples=1, deadline=None)
@given(data=st.data())
def test_drawn_raw_blocks_smoke(family, fmt, kernel, scales, data):
    _check_drawn(data, family, fmt, kernel, scales)


@pytest.mark.slow
@pytest.mark.parametrize("family,fmt,kernel,scales", CASES, ids=[f"{c[2]}-{c[1]}" for c in CASES])
@settings(max_examples=2, deadline=None)
@given(data=st.data())
def test_drawn_raw_blocks(family, fmt, kernel, scales, data):
    """Every family x format on drawn raw blocks, within the bound its runner holds it to (exact GEMVs 1e-5 of
    float64, fp16 GEMMs 1e-3, fragment and dequantize passes bit for bit)."""
    _check_drawn(data, family, fmt, kernel, scales)


def largest_weights(fmt: str, m: int, k: int, rng) -> np.ndarray:
    """Raw blocks of `fmt` whose scale fields are ±fp16_weight_scale(fmt) and, in every other block, whose fields
    make the largest |w| the format can express at that scale (Q4_K / Q5_K: sc = m = 63, q at its top, d and dmin
    of opposite signs; Q6_K sc = −128, q − 32 = −32; Q8_0 q = −128; TQ4_1S the codebook's ends): the weights at
    the edge of fp16 (65457 to 65504) beside blocks of any bytes."""
    f = formats.get(fmt)
    nb = m * (k // f.block_size)
    raw = rng.integers(0, 256, (nb, f.block_bytes), dtype=np.uint8)
    rec = raw.view(f.dtype).reshape(nb)
    s = S.fp16_weight_scale(fmt)
    halves = [n for n in f.dtype.names if f.dtype[n] == np.dtype("<f2")]
    for n in halves:
        rec[n] = (s * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
    top = rec[::2]
    if fmt in ("q4_K", "q5_K"):
        top["dmin"] = -top["d"]
        top["scales"], top["qs"] = 0xFF, 0xFF
        if fmt == "q5_K":
            top["qh"] = 0xFF
    elif fmt == "q6_K":
        top["scales"], top["ql"], top["qh"] = -128, 0, 0
    elif fmt == "q8_0":
        top["qs"] = -128
    else:  # TQ4_1S: indices 0 and 15, C[0] = −C[15] the codebook's largest magnitude
        top["qs"] = rng.choice([0x00, 0xFF, 0x0F, 0xF0], top["qs"].shape)
    rec[::2] = top
    return raw.reshape(m, k // f.block_size * f.block_bytes)


FP16_CASES = [c for c in CASES if c[3] == FP16]
LARGEST_SMOKE = ["mmq_q5_k_wgmma_ra_n64", "mmq_q8_0_wgmma_ra_n64"]


@pytest.mark.parametrize("family,fmt,kernel", [
    pytest.param(*c[:3], id=f"{c[2]}-{c[1]}", marks=() if c[2] in LARGEST_SMOKE else pytest.mark.slow)
    for c in FP16_CASES])
def test_largest_weights_that_fit_fp16_through_the_fp16_gemms(family, fmt, kernel):
    """The fp16-weight kernels at the edge of their scale bound: half the blocks hold weights of 65457-65504 (the
    largest the format can express at fp16_weight_scale), the rest any bytes at ±that scale; finite, within the
    runner's 1e-3 of float64."""
    rng = np.random.default_rng(len(kernel))
    assert 65457 <= np.abs(_held(fmt, largest_weights(fmt, 4, 512, rng), 4, 512)).max() <= 65504
    with drawn_weights(fmt, lambda f, m, k: largest_weights(f, m, k, rng)) as weights:
        out = _run(fmt, kernel, seed=3)
    assert weights.draws == 1 and out.ok, f"{family}: {out.detail} ({weights.draws} weights drawn)"


def _held(fmt, raw, m, k):
    """The weights as the kernels hold them: W dequantized as ggml does, or TQ4_1S's rotated-domain d·C[q]."""
    if fmt == "tq4_1s":
        return formats.tq4_1s.rotated_values(formats.get(fmt).blocks(raw, (m, k)))
    return formats.dequantize(fmt, raw, (m, k))
