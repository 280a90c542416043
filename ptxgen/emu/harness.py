"""Per-kernel harnesses for the emulator: draw inputs, launch the emitted PTX in the emulator, compare
with the NumPy reference. The same launch geometry the runtime uses (from the manifest's meta)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import formats
from .machine import Memory, run_kernel


@dataclass
class Outcome:
    kernel: str
    ok: bool
    detail: str
    got: np.ndarray
    want: np.ndarray


def _q8_1(ptx: str, rng, shape=(4, 96), seed=None) -> Outcome:
    t, k = shape
    x = rng.standard_normal((t, k)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
    x[0, :32] = 0
    mem = Memory()
    xa = mem.alloc(x)
    nb = t * k // 32
    ya = mem.alloc(nb * 36, poison=0xFF)
    run_kernel(ptx, ((nb + 7) // 8,), (256,), (xa, ya, nb), mem, seed=seed)
    got = mem.view(ya, np.uint8, (t, k // 32 * 36))
    want = formats.quantize("q8_1", x)
    ok = np.array_equal(got, want)
    return Outcome("quantize_q8_1", ok, "bit-exact" if ok else f"{np.count_nonzero(got != want)} bytes differ", got, want)


def _deq_q4_k(ptx: str, rng, shape=(5, 512), seed=None) -> Outcome:
    m, k = shape
    w = rng.standard_normal((m, k)).astype(np.float32)
    raw = formats.quantize("q4_K", w)
    mem = Memory()
    wa = mem.alloc(raw)
    ya = mem.alloc(m * k * 2, poison=0xFF)
    ns = m * k // 256
    run_kernel(ptx, ((ns + 7) // 8,), (256,), (wa, ya, ns), mem, seed=seed)
    got = mem.view(ya, np.uint16, (m, k))
    want = formats.dequantize("q4_K", raw, (m, k)).astype(np.float16).view(np.uint16)
    ok = np.array_equal(got, want)
    return Outcome("dequantize_q4_k", ok, "bit-exact" if ok else f"{np.count_nonzero(got != want)} of {got.size} differ",
                   got, want)


HARNESSES: dict[str, Callable] = {"quantize_q8_1": _q8_1, "dequantize_q4_k": _deq_q4_k}


def check_kernel(name: str, ptx: str, seed: int = 0, **kw) -> Outcome:
    if name not in HARNESSES:
        raise KeyError(f"no emulator harness for {name}; have: {', '.join(HARNESSES)}")
    return HARNESSES[name](ptx, np.random.default_rng(seed), seed=seed, **kw)
