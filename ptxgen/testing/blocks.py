"""Random valid quantized blocks with NumPy alone: the emulator's harnesses draw weights with these, so
`python -m ptxgen.emu` runs without hypothesis (the `test` extra)."""
from __future__ import annotations

import numpy as np

from ptxgen import formats


def random_raw(fmt: str, m: int, k: int, rng: np.random.Generator, scale=(1e-3, 1e-2)) -> np.ndarray:
    """Random valid weights of any size, fast (no quantizer): every byte drawn uniformly, then each block's fp16
    scale fields set to finite values in `scale` (so products stay far from fp16's range). uint8 (m, row bytes)."""
    f = formats.get(fmt)
    nb = m * (k // f.block_size)
    raw = rng.integers(0, 256, (nb, f.block_bytes), dtype=np.uint8)
    rec = raw.view(f.dtype).reshape(nb)
    for name in f.dtype.names:
        if f.dtype[name] == np.dtype("<f2"):
            rec[name] = rng.uniform(*scale, nb).astype(np.float16)
    return raw.reshape(m, k // f.block_size * f.block_bytes)
