"""Weight codecs: one module per GGUF format with its block geometry and the decodes the kernels consume
(docs/design.md). `get(fmt)` gives a format's codec."""
from __future__ import annotations

from . import q4_k, q5_k, q6_k, q8_0, tq4_1s

CODECS = {c.FMT: c for c in (q4_k, q5_k, q6_k, q8_0, tq4_1s)}


def get(fmt: str):
    try:
        return CODECS[fmt]
    except KeyError:
        raise ValueError(f"no weight codec for {fmt!r} yet (have: {', '.join(CODECS)})") from None
