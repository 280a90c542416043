"""The TQ4_1S weight codec (TurboQuant's 4-bit format, ptxgen/formats/tq4_1s.py): 20 bytes per 32 weights, a
codebook value per nibble and the activation rotated by a per-block Hadamard transform. Its decodes live in its
kernels (kernels/gemv.py) for now; this module names its geometry and mul_mat's routes."""
from __future__ import annotations

FMT = "tq4_1s"
BLOCK_K = 32
BLOCK_BYTES = 20
ROUTES = {"exact": ("decode_tq4",), "fast": ("fast_lanes",)}  # mul_mat's routes (runtime/ops.py) per mode
FAST_LANES = ("prep_tq4_1s_q8", "gemv_tq4_1s_fast_t{}")
LANE_STEM = "tq4_1s"


def weights_error(mode: str, k: int, ptr: int) -> str | None:
    return None
