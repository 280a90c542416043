"""mul_mat's kernel choice over a grid of device × format × mode × arch × shape × T, planned without a GPU
(ptxgen.testing.fakegpu), as runs: for each case, the T from which a kernel sequence starts. The golden copy in
tests/data/dispatch.json pins today's choices, so a refactor of the dispatch that changes one is seen.

    python -m ptxgen.testing.dispatch > tests/data/dispatch.json     (after a deliberate change of the rule)
"""
from __future__ import annotations

import json
import sys

from ptxgen.runtime.driver import Context

DEVICES = {"sm_90 H200": Context(0, None, "fake H200", 90, 132, 227 * 1024, 60 << 20),
           "sm_89 142 SMs": Context(0, None, "fake sm_89", 89, 142, 99 * 1024, 96 << 20)}
SHAPES = [(64, 4096), (127, 512), (128, 256), (3584, 3584), (4096, 4096), (4096, 14336), (14336, 4096), (18944, 3584)]
TOKENS = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 48, 64, 65, 128, 129, 256, 512, 1024, 4096, 8192]
FORMATS = (("q4_K", ("exact", "fast")), ("tq4_1s", ("exact", "fast")), ("q8_0", ("fast",)))
SLICED_MAX_T = 64  # formats whose T > 8 runs the GEMV in slices of 8: the pattern repeats, stop here


def table(monkeypatch) -> dict:
    """{"device|fmt|mode|arch|MxK": [[T, "kernel + kernel"], ...]} with a row wherever the sequence changes."""
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    out = {}
    for dname, ctx in DEVICES.items():
        fakegpu.install(monkeypatch, ctx)
        for fmt, modes in FORMATS:
            for m, k in SHAPES:
                w = fakegpu.weights(fmt, m, k)
                for mode in modes:
                    for arch in ((None, "sm_89") if ctx.sm == 90 else (None,)):
                        runs, last = [], None
                        for t in TOKENS:
                            if fmt != "q4_K" and t > SLICED_MAX_T:
                                break
                            seq = " + ".join(dict.fromkeys(ops.mul_mat_plan(w, t, mode=mode, arch=arch).kernels))
                            if seq != last:
                                runs.append([t, seq])
                                last = seq
                        out[f"{dname}|{fmt}|{mode}|{arch or 'auto'}|{m}x{k}"] = runs
        monkeypatch.undo()
    return out


def main() -> None:
    from _pytest.monkeypatch import MonkeyPatch

    from ptxgen import knobs

    knobs.reload()
    sys.stdout.write(dumps(table(MonkeyPatch())))


def dumps(t: dict) -> str:
    """The table as JSON with one case per line (diffs of the golden file read as rule changes)."""
    lines = [f" {json.dumps(key)}: {json.dumps(runs)}" for key, runs in t.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    main()
