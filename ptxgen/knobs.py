"""ptxgen's switches, in one place: the user's settings (environment variables, the README lists them) and the
kernel-choice switches of the benchmarks and tests (not read from the environment).

A user setting is read from the environment once, at its first use, and kept: an op on the hot path never reads
the environment. The kernel-choice switches (LOWERING) force one lowering where the tuned dispatch would pick
another, for A/B measurements: the benchmark programs take them as `--knob NAME=VALUE`, a process sets them with
`knobs.set(PTXGEN_MMQ_CX="0")` (for good) or `with knobs.override(PTXGEN_MMQ_CX="0"): ...` (for a block). Since
2026-12-02 they are not read from the environment (one set there is ignored, with a warning): a user's calls run
the tuned dispatch, whose thresholds are data (ptxgen/tuning). `knobs.reload()` re-reads the environment. Every
change bumps `knobs.generation()`, which the runtime's cached launch plans are keyed by, so a plan made under the
old value is not reused.

User settings (environment):
PTXGEN_CACHE_DIR   where compiled cubins are cached (default ~/.cache/ptxgen)
PTXGEN_NO_CACHE    1: neither read nor write the disk cache
PTXGEN_KEEP        a folder: keep ptx, cubin, ptxas log and SASS of every compile there
PTXGEN_VERBOSE     1: print compiles, cache hits and launches to stderr
PTXGEN_EMITTED_DIR load kernels from this folder instead of the packaged emitted/

Kernel-choice switches (auto / 1 / 0; benchmarks' --knob, knobs.set / knobs.override):
PTXGEN_TQ4_MMA     exact TQ4_1S decode on the tensor-core GEMV (sm_90): unset/auto = slices of 5-8 tokens,
                   1 = every slice, 0 = never
PTXGEN_Q4K_MMA     exact Q4_K decode on the tensor-core GEMV (sm_90): unset/auto = slices of 2-8 tokens and single
                   tokens from 2^25 weights, 1 = every slice and 9-16 tokens on its 16-token build instead of the
                   MMQ, 0 = never
PTXGEN_Q4K_XR      exact Q4_K decode of single tokens on gemv_q4_k_xr (the activation in registers; K ≤ 24576):
                   1 = those slices (unless PTXGEN_Q4K_MMA=1; not in emitted/: built from the DSL when first
                   asked for); unset/auto/0 = never (it measured slower)
PTXGEN_Q4K_T1      exact Q4_K decode of 1-8 tokens on gemv_q4_k_mma_t{1,2,4,8} (prep_q4k_t*, token n's hi and lo as B
                   columns 2n, 2n + 1, weights through a cp.async ring): unset/auto = from 14·2^20 weights, 1 = every
                   such slice, 0 = never (PTXGEN_Q4K_MMA=1 and PTXGEN_Q4K_XR=1 take precedence)
PTXGEN_Q4K_FUSED   exact Q4_K decode of 1-4 tokens on gemv_q4_k_mma_t{1,2,4} in one launch (gemv_q4_k_mma_t*_fused build
                   the activation records themselves) instead of prep_q4k_t* + gemv_q4_k_mma_t*: unset/auto = in
                   eager calls (captured into a CUDA graph the two kernels run faster), 1 = always, 0 = never (Q5_K's
                   builds alike, where the tuning's codec_few_max_tokens runs them)
PTXGEN_Q4K_T16H    Q4_K calls of 9-16 tokens in exact mode on gemv_q4_k_mma_t16h (fp16 activations, relative error
                   ~2e-4, the prefill GEMMs' accuracy): unset/auto = yes unless PTXGEN_Q4K_MMA=1, 1 = yes, 0 = never
                   (the exact 16-token GEMV gemv_q4_k_mma_n16, or the MMQ with PTXGEN_Q4K_MMA=0)
PTXGEN_MMQ_SKINNY  exact-mode Q4_K prefill (M ≥ 128) on the register-A skinny GEMM mmq_q4_k_rega_n32 (fp16 activations,
                   token groups of 32): unset/auto = from 17 tokens up to the tuning's skinny_max_tokens for the MMQ
                   path it replaces (64 for mma.sync; 32 for wgmma, from 2^25 weights), 1 = 17-128 tokens, 0 = never
                   (9-16 tokens then stay on gemv_q4_k_mma_t16h where mmq_q4_k_rega_n16 would run them)
PTXGEN_MMQ_REGA    the sm_90 prefill GEMM with A (the dequantized weights) from registers: unset/auto = T of
                   the tuning's wgmma_ra_min_tokens or more, 1 = at every T the wgmma MMQ runs, 0 = never (A from shared memory)
PTXGEN_MMQ_CX      the sm_90 register-A prefill GEMM converts fp32 x to fp16 itself (its idle producer warps, under
                   the GEMM; mmq_q4_k_wgmma_ra_n*_cx) instead of a convert_f16_perm launch first: unset/auto = from
                   the tuning's mmq_cx_min_tokens tokens when its plan has at most mmq_cx_max_splits K splits,
                   1 = always, 0 = never
PTXGEN_MMQ_PRE     the sm_90 register-A prefill GEMM on prepared A fragments (dequantize_q4_k_frags first, then
                   mmq_q4_k_wgmma_pre_n256{,_cx}: no dequant in the K loop): unset/auto = from the tuning's
                   mmq_pre_min_tokens tokens, 1 = wherever the register-A path runs its n256 tile, 0 = never
PTXGEN_ROTATE_F16  TQ4_1S's prefill GEMMs on x rotated by rotate_tq4_1s_f16 (fp32 or fp16 x → the rotated fp32 the
                   fixup reads and the fp16 copy the GEMM reads, one launch): unset/auto/1 = yes, 0 = the launches
                   before it (convert_f32 for an fp16 x, rotate_tq4_1s, convert_f16 / convert_f16_perm), for A/B
PTXGEN_MMQ_TAIL_SPLIT  the mma.sync MMQ's split-K plan: unset/auto/1 = whole tiles, then the last partial round's
                   tiles split in K (runtime.ops.splitk_plan_tail), 0 = every tile split alike when the tiles fit
                   one round of resident CTAs, none otherwise (the plan before it, for A/B measurements)
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from pathlib import Path

USER = ("PTXGEN_CACHE_DIR", "PTXGEN_NO_CACHE", "PTXGEN_KEEP", "PTXGEN_VERBOSE", "PTXGEN_EMITTED_DIR")
LOWERING = ("PTXGEN_TQ4_MMA", "PTXGEN_Q4K_MMA", "PTXGEN_Q4K_XR", "PTXGEN_Q4K_T1", "PTXGEN_Q4K_FUSED",
            "PTXGEN_Q4K_T16H", "PTXGEN_MMQ_SKINNY", "PTXGEN_MMQ_REGA", "PTXGEN_MMQ_CX", "PTXGEN_MMQ_PRE",
            "PTXGEN_MMQ_X16", "PTXGEN_MMQ_TAIL_SPLIT", "PTXGEN_ROTATE_F16")
_VALUES: dict[str, str] = {}  # name → the raw value in force ("" = unset), read once
_GENERATION = [0]
_LOCK = threading.Lock()


def _raw(name: str) -> str:
    v = _VALUES.get(name)
    if v is None:
        if name in LOWERING:  # not a user setting: never from the environment
            if os.environ.get(name):
                warnings.warn(f"{name} is set in the environment and not read: kernel choices are benchmark "
                              f"arguments (--knob {name}=...) or ptxgen.knobs.set(...) in a process since "
                              "2026-12-02; the tuned dispatch runs", stacklevel=3)
            v = _VALUES.setdefault(name, "")
        else:
            v = _VALUES.setdefault(name, os.environ.get(name, ""))
    return v


def parse(items) -> dict[str, str]:
    """The benchmarks' `--knob NAME=VALUE` arguments as knobs.set's keywords (NAME with or without PTXGEN_, any
    case: q4k_mma=0 is PTXGEN_Q4K_MMA=0)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--knob {item!r}: expected NAME=VALUE")
        name = name.strip().upper()
        out[name if name.startswith("PTXGEN_") else "PTXGEN_" + name] = value.strip()
    return out


def generation() -> int:
    """A number that changes whenever a knob's value may have changed (set, override, reload)."""
    return _GENERATION[0]


def set(**values) -> None:  # noqa: A001 - knobs.set reads as what it does
    """Set knobs in this process: `knobs.set(PTXGEN_MMQ_CX="0")`; None or "" restores the unset default. The value
    is checked when the knob is next used (an invalid one raises there, as from the environment)."""
    with _LOCK:
        for name, v in values.items():
            if name not in USER + LOWERING:
                raise ValueError(f"knobs.set: no knob {name!r} (user settings: {', '.join(USER)}; kernel "
                                 f"choices: {', '.join(LOWERING)})")
            _VALUES[name] = "" if v is None else str(v)
        _GENERATION[0] += 1


@contextlib.contextmanager
def override(**values):
    """`with knobs.override(PTXGEN_Q4K_T1="0"): ...`: the knobs take these values inside the block only."""
    with _LOCK:
        saved = {n: _VALUES.get(n) for n in values}
    set(**values)
    try:
        yield
    finally:
        with _LOCK:
            for n, v in saved.items():
                if v is None:
                    _VALUES.pop(n, None)
                else:
                    _VALUES[n] = v
            _GENERATION[0] += 1


def reload() -> None:
    """Forget every value read or set: the next use reads the environment again."""
    with _LOCK:
        _VALUES.clear()
        _GENERATION[0] += 1


def cache_dir() -> Path:
    return Path(_raw("PTXGEN_CACHE_DIR") or Path.home() / ".cache" / "ptxgen")


def cache_enabled() -> bool:
    return _raw("PTXGEN_NO_CACHE") not in ("1", "true", "yes")


def keep_dir() -> Path | None:
    v = _raw("PTXGEN_KEEP")
    return Path(v) if v else None


def verbose() -> bool:
    return _raw("PTXGEN_VERBOSE") not in ("", "0", "false", "no")


def emitted_dir() -> Path | None:
    v = _raw("PTXGEN_EMITTED_DIR")
    return Path(v) if v else None


def _auto_on_off(name: str) -> str:
    """"auto" (unset), "on" (1/true/yes) or "off" (0/false/no); anything else is an error, not a silent default."""
    v = _raw(name).strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v in ("1", "true", "yes", "on"):
        return "on"
    if v in ("0", "false", "no", "off"):
        return "off"
    raise ValueError(f"{name}={v!r}: expected auto, 1 or 0")


def tq4_mma() -> str:
    return _auto_on_off("PTXGEN_TQ4_MMA")


def q4k_mma() -> str:
    return _auto_on_off("PTXGEN_Q4K_MMA")


def q4k_xr() -> str:
    return _auto_on_off("PTXGEN_Q4K_XR")


def q4k_t1() -> str:
    return _auto_on_off("PTXGEN_Q4K_T1")


def q4k_fused() -> str:
    return _auto_on_off("PTXGEN_Q4K_FUSED")


def q4k_t16h() -> str:
    return _auto_on_off("PTXGEN_Q4K_T16H")


def mmq_skinny() -> str:
    return _auto_on_off("PTXGEN_MMQ_SKINNY")


def mmq_rega() -> str:
    return _auto_on_off("PTXGEN_MMQ_REGA")


def mmq_tail_split() -> str:
    return _auto_on_off("PTXGEN_MMQ_TAIL_SPLIT")


def mmq_x16() -> str:
    return _auto_on_off("PTXGEN_MMQ_X16")


def mmq_cx() -> str:
    return _auto_on_off("PTXGEN_MMQ_CX")


def rotate_f16() -> bool:
    """PTXGEN_ROTATE_F16: whether TQ4_1S's prefill rotation writes the GEMM's fp16 copy itself (auto: yes)."""
    return _auto_on_off("PTXGEN_ROTATE_F16") != "off"


def mmq_pre() -> str:
    return _auto_on_off("PTXGEN_MMQ_PRE")
