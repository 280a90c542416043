"""mul_mat's kernel choice over a grid of device × format × mode × arch × shape × T, planned without a GPU
(ptxgen.testing.fakegpu), as runs: for each case, the T from which a kernel sequence starts; mul_mat_id's likewise
over bench_moe's two expert shapes. The grid's T are samples: where two neighbours plan different routes, the T
between them are bisected (a plan is a pure function of T here), so each route's first T is exact, not the grid
point after it (a run of GEMV slices, whose kernels vary with T mod 8, is shown at the grid's T). The golden copy in
tests/data/dispatch.json pins today's choices, so a refactor of the dispatch that changes one is seen.

    python -m ptxgen.testing.dispatch > tests/data/dispatch.json     (after a deliberate change of the rule)
    python -m ptxgen.testing.dispatch --markdown                      (docs/design.md's dispatch section)
"""
from __future__ import annotations

import json
import re
import sys

from ptxgen.codecs import CODECS
from ptxgen.runtime.driver import Context

DEVICES = {"sm_90 H200": Context(0, None, "fake H200", 90, 132, 227 * 1024, 60 << 20),
           "sm_89 142 SMs": Context(0, None, "fake sm_89", 89, 142, 99 * 1024, 96 << 20),
           "sm_120 170 SMs": Context(0, None, "fake sm_120", 120, 170, 99 * 1024, 96 << 20)}
SHAPES = [(64, 4096), (127, 512), (128, 256), (3584, 3584), (4096, 4096), (4096, 14336), (14336, 4096), (18944, 3584)]
TOKENS = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 48, 64, 65, 128, 129, 256, 512, 1024, 4096, 8192]
FORMATS = tuple((fmt, tuple(c.ROUTES)) for fmt, c in CODECS.items())  # every format, in each mode it has
MOE_SHAPES = [(128, 8, 768, 2048), (32, 4, 1792, 2048)]  # (experts, slots a token, M, K): bench_moe's
MOE_TOKENS = [1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096]
SLICED_MAX_T = 64  # the docs table: past this T a plan made of slices of 8 tokens repeats its pattern
SLICE = "slices of 8 tokens, each as above (the last as its own T)"


def _changes(at, lo: int, hi: int) -> list:
    """Every T in (lo, hi] where at(T) differs from at(T - 1), for a pure `at`: while an interval's ends differ, it is
    halved, down to adjacent T; a half whose ends agree is taken as one run (a change and its undoing inside it
    would not be seen: the grid's T must be dense enough for that)."""
    if at(lo) == at(hi):
        return []
    if hi - lo == 1:
        return [hi]
    mid = (lo + hi) // 2
    return _changes(at, lo, mid) + _changes(at, mid, hi)


def _exact_runs(tokens, route, shown, stop=None) -> list:
    """[[T, shown(T)], ...] with a row wherever shown(T) changes: between adjacent grid T whose route(T) differs, the
    exact T of each change of route (bisected: `_changes`), and the grid's T where only `shown` differs (a run of
    GEMV slices, whose kernels follow T mod 8). route and shown are pure functions of T; the rows stop after the
    first grid T with stop(T)."""
    runs, prev = [], None

    def add(t):
        if not runs or shown(t) != runs[-1][1]:
            runs.append([t, shown(t)])

    for t in tokens:
        if prev is not None:
            for c in _changes(route, prev, t):
                add(c)
        add(t)
        if stop is not None and stop(t):
            break
        prev = t
    return runs


def _runs(fmt: str, mode: str, arch, m: int, k: int, tokens, *, label_slices: bool) -> list:
    """[[T, kernels], ...] where the sequence changes, each route's first T exact (`_exact_runs`). A plan for T > 8
    made only of GEMVs (and their activation preps), launched more than once or only kernels the T ≤ 8 plans use,
    runs a decode GEMV in slices (one route, however T mod 8 mixes its kernels): with `label_slices` it reads as
    SLICE where the T ≤ 8 plans hold all its kernels, else as `_slices_label`, and the rows stop at the first grid T
    past SLICED_MAX_T that runs slices."""
    from ptxgen.runtime import ops

    plans: dict = {}

    def plan(t: int) -> tuple:
        if t not in plans:
            names = ops.choose(fmt, mode, arch, t, m, k).kernels
            plans[t] = (names, " + ".join(dict.fromkeys(names)))
        return plans[t]

    small = set().union(*(plan(t)[0] for t in range(1, 9)))

    def slices(t: int) -> str | None:
        """SLICE, _slices_label's, or None where T's plan is not GEMV slices."""
        names = plan(t)[0]
        if t <= 8:
            return None
        if small.issuperset(names):
            return SLICE
        gemvs = [n for n in names if n.startswith("gemv_")]
        if len(gemvs) > 1 and all(n.startswith(("gemv_", "prep_")) for n in names):
            return _slices_label(names)
        return None

    def route(t: int) -> str:
        return slices(t) or plan(t)[1]

    return _exact_runs(tokens, route, route if label_slices else (lambda t: plan(t)[1]),
                       stop=(lambda t: t > SLICED_MAX_T and slices(t) is not None) if label_slices else None)


def _slices_label(names: list) -> str:
    """A run of GEMV slices whose kernels the T ≤ 8 plans do not all use (another route's GEMV: Q6_K's fp32 GEMV
    past its tensor-core one's 8 tokens, Q5_K's 16-token slices, the exact GEMV a mode="fast" call falls back to),
    named by its first slice: the launches up to the first GEMV, whose _t<n> suffix is the slice's tokens (8 if
    none). The same for every T of the run (each slice but the last is the first's)."""
    first = names[:next(i for i, n in enumerate(names) if n.startswith("gemv_")) + 1]
    size = re.search(r"_t(\d+)$", first[-1])
    return (f"slices of {size.group(1) if size else 8} tokens, each {' + '.join(first)} (a shorter last slice: "
            "its own size's GEMV)")


def _moe_runs(fmt: str, arch, e: int, slots: int, m: int, k: int) -> list:
    """mul_mat_id's [[T, kernels], ...] where its sequence changes, each change's T exact (`_exact_runs`)."""
    from functools import cache

    from ptxgen.runtime import ops

    seq = cache(lambda t: " + ".join(ops.mul_mat_id_kernels(fmt, t, slots, e, k, m, arch)))
    return _exact_runs(MOE_TOKENS, seq, seq)


def table(monkeypatch) -> dict:
    """{"device|fmt|mode|arch|MxK": [[T, "kernel + kernel"], ...]} with a row wherever the sequence changes (at the
    exact T where the route changes, `_runs`); the mul_mat_id cases as "device|fmt|mul_mat_id E x top-S|arch|MxK"."""
    from ptxgen import codecs
    from ptxgen.testing import fakegpu

    out = {}
    for dname, ctx in DEVICES.items():
        fakegpu.install(monkeypatch, ctx)
        for fmt, modes in FORMATS:
            for m, k in SHAPES:
                for mode in modes:
                    for arch in ((None, "sm_89") if ctx.sm == 90 else (None,)):
                        out[f"{dname}|{fmt}|{mode}|{arch or 'auto'}|{m}x{k}"] = _runs(
                            fmt, mode, arch, m, k, TOKENS, label_slices=False)
        for fmt in codecs.moe():
            for e, slots, m, k in MOE_SHAPES:
                for arch in ((None, "sm_89") if ctx.sm == 90 else (None,)):
                    out[f"{dname}|{fmt}|mul_mat_id {e} x top-{slots}|{arch or 'auto'}|{m}x{k}"] = _moe_runs(
                        fmt, arch, e, slots, m, k)
        monkeypatch.undo()
    return out


# the cases docs/design.md tabulates: (format, mode, arch, M, K), planned on the fake H200
DOC_CASES = [("q4_K", "exact", None, 4096, 14336), ("q4_K", "exact", None, 64, 4096),
             ("q4_K", "exact", "sm_89", 4096, 14336), ("q4_K", "fast", None, 4096, 14336),
             ("tq4_1s", "exact", None, 18944, 3584), ("tq4_1s", "fast", None, 18944, 3584),
             ("q8_0", "fast", None, 4096, 4096), ("q8_0", "exact", None, 4096, 4096), ("q6_K", "exact", None, 4096, 14336)]
DOC_TOKENS = list(range(1, 65)) + [65, 128, 129, 256, 512, 1024, 4096, 8192, 16384]
BEGIN = "<!-- dispatch: generated by `python -m ptxgen.testing.dispatch --markdown`; edit ptxgen/tuning, not this -->"
END = "<!-- dispatch: end -->"


def markdown(monkeypatch) -> str:
    """docs/design.md's dispatch section: the kernels of eager calls by T on the H200 for DOC_CASES (calls that run
    the GEMV in slices of 8 tokens are one row), then every rule of the H200's tuning file."""
    from ptxgen import tuning
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch, DEVICES["sm_90 H200"])
    out = [BEGIN, "", "| weights, mode, target | M × K | T | kernels |", "|---|---|---|---|"]
    for fmt, mode, arch, m, k in DOC_CASES:
        runs = _runs(fmt, mode, arch, m, k, DOC_TOKENS, label_slices=True)
        for i, (t0, seq) in enumerate(runs):
            t1 = runs[i + 1][0] - 1 if i + 1 < len(runs) else None
            span = f"{t0}" if t1 == t0 else f"{t0}–{t1}" if t1 else f"≥ {t0}"
            what = f"{fmt} {mode}, {arch + ' PTX' if arch else 'sm_90a'}" if i == 0 else ""
            out.append(f"| {what} | {f'{m} × {k}' if i == 0 else ''} | {span} | {seq} |")
    monkeypatch.undo()
    rules = tuning.load("h200")
    out += ["", f"Thresholds ({rules.gpu}; `ptxgen/tuning/h200.json`):", "", "| rule | value | why |", "|---|---|---|"]
    for name in rules.names():
        v = getattr(rules, name)
        shown = ", ".join(f"{a} {b}" for a, b in v.items()) if isinstance(v, dict) else (
            f"2^{v.bit_length() - 1}" if v > 4096 and v & (v - 1) == 0 else
            f"{v >> 20}·2^20" if v > 4096 and v % (1 << 20) == 0 else f"{v}")
        out.append(f"| `{name}` | {shown} | {rules.why(name)} |")
    return "\n".join(out + ["", END]) + "\n"


def main() -> None:
    from _pytest.monkeypatch import MonkeyPatch

    from ptxgen import knobs

    knobs.reload()
    mp = MonkeyPatch()
    sys.stdout.write(markdown(mp) if "--markdown" in sys.argv else dumps(table(mp)))


def dumps(t: dict) -> str:
    """The table as JSON with one case per line (diffs of the golden file read as rule changes)."""
    lines = [f" {json.dumps(key)}: {json.dumps(runs)}" for key, runs in t.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    main()
