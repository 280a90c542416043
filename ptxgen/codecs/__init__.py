"""Weight codecs: one module per GGUF format with its block geometry and the decodes the kernels consume
(docs/design.md). `get(fmt)` gives a format's codec."""
from __future__ import annotations

from . import q4_k

CODECS = {q4_k.FMT: q4_k}


def get(fmt: str):
    try:
        return CODECS[fmt]
    except KeyError:
        raise ValueError(f"no weight codec for {fmt!r} yet (have: {', '.join(CODECS)})") from None
