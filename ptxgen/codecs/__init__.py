"""Weight codecs: one module per GGUF format with its block geometry and the decodes the kernels consume
(docs/design.md). `get(fmt)` gives a format's codec. The decodes: `dequant_lane` (a warp's 256 weights, the
dequantize kernels and the codec GEMVs), `dequant_lane_wide` (16 weights a lane, the GEMVs), `run8` (8 weights at
any multiple of 8: the prepared GEMM's fragments, the MoE GEMM's A tile) and, where one header serves a sub-block,
`run32` (32 weights, bit-identical to four run8s)."""
from __future__ import annotations

from . import q4_k, q5_k, q6_k, q8_0, tq4_1s

CODECS = {c.FMT: c for c in (q4_k, q5_k, q6_k, q8_0, tq4_1s)}


def with_route(route: str) -> tuple[str, ...]:
    """The formats whose mul_mat takes `route` (runtime/ops.py) in some mode, in CODECS' order: the kernels a route
    needs are built for these."""
    return tuple(f for f, c in CODECS.items() if any(route in routes for routes in c.ROUTES.values()))


def dequantizable() -> tuple[str, ...]:
    """The formats whose `dequant_lane` gives the weights W themselves (not a rotated domain's, as TQ4_1S's)."""
    return tuple(f for f, c in CODECS.items() if hasattr(c, "dequant_lane") and not hasattr(c, "ROTATION"))


def moe() -> tuple[str, ...]:
    """The formats mul_mat_id runs: every codec with lanes (a rotated-domain one, TQ4_1S, on its ROTATION's x)."""
    return tuple(f for f, c in CODECS.items() if hasattr(c, "dequant_lane"))


def get(fmt: str):
    try:
        return CODECS[fmt]
    except KeyError:
        raise ValueError(f"no weight codec for {fmt!r} yet (have: {', '.join(CODECS)})") from None
