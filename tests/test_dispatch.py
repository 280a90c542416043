"""mul_mat's and mul_mat_id's kernel choice, pinned: the plans over a grid of device × format × mode × arch × shape × T
(planned without a GPU; each route's first T bisected between the grid's, exact) equal tests/data/dispatch.json. A
deliberate change of the rule regenerates that file (`python -m ptxgen.testing.dispatch > tests/data/dispatch.json`)
and shows up in its diff, one case per line."""
import json
import os
import re

import pytest

from conftest import DATA, REPO
from ptxgen import knobs
from ptxgen.testing import dispatch


@pytest.fixture
def shipped_rule(monkeypatch):
    """The rule as shipped: every PTXGEN_ knob unset (on auto)."""
    for var in [v for v in os.environ if v.startswith("PTXGEN_")]:
        monkeypatch.delenv(var, raising=False)
    knobs.reload()
    return monkeypatch


def test_dispatch_is_the_golden_table(shipped_rule):
    golden = json.loads((DATA / "dispatch.json").read_text())
    got = json.loads(dispatch.dumps(dispatch.table(shipped_rule)))
    changed = [k for k in golden if got.get(k) != golden[k]] + [k for k in got if k not in golden]
    assert not changed, f"{len(changed)} cases differ from tests/data/dispatch.json, e.g. {changed[0]}: " \
                        f"{got.get(changed[0])} (golden {golden.get(changed[0])})"


def test_the_design_docs_dispatch_section_is_generated_from_the_rule(shipped_rule):
    """docs/design.md's dispatch table and thresholds are `python -m ptxgen.testing.dispatch --markdown`'s output."""
    doc = (REPO / "docs" / "design.md").read_text()
    want = dispatch.markdown(shipped_rule)
    a, b = doc.find(dispatch.BEGIN), doc.find(dispatch.END)
    assert a >= 0 and b > a and doc.count(dispatch.BEGIN) == doc.count(dispatch.END) == 1, \
        "docs/design.md must hold its generated dispatch section once"
    assert doc[a:b + len(dispatch.END)] + "\n" == want, \
        "docs/design.md's dispatch section is stale: python -m ptxgen.testing.dispatch --markdown"


def test_changes_finds_every_change_between_two_grid_points():
    """The bisection reports each T where a pure function of T changes, several between two samples included, and
    nothing where the ends agree."""
    at = lambda t: (t >= 5) + (t >= 7) + (t >= 64) + (t >= 1025)  # noqa: E731
    assert dispatch._changes(at, 1, 2000) == [5, 7, 64, 1025]
    assert dispatch._changes(at, 1, 4) == [] and dispatch._changes(at, 1025, 4096) == []
    assert dispatch._changes(at, 6, 7) == [7]
    seq = lambda t: "a" if t < 300 else "b" if t < 301 else "c"  # noqa: E731  a one-T run
    assert dispatch._exact_runs([1, 256, 4096], seq, seq) == [[1, "a"], [300, "b"], [301, "c"]]


def _kernels(fmt, t, m=4096, k=14336):
    from ptxgen.runtime import ops

    return ops.choose(fmt, "exact", None, t, m, k).kernels


@pytest.mark.parametrize("fmt, last, first, before, after", [
    ("q6_K", 1024, 1025, "mmq_q6_k_wgmma_ra_n256", "dequantize_q6_k"),  # codec_ra_mmq_max_tokens q6_K (f16a)
    ("q5_K", 2048, 2049, "mmq_q5_k_wgmma_ra_n256", "dequantize_q5_k"),  # ... q5_K
])
def test_runs_start_at_the_exact_t_where_the_plan_changes(shipped_rule, fmt, last, first, before, after):
    """The tables' rows begin where ops.choose's plan changes, not at the next grid T (the audit: Q6_K's register-A
    n256 GEMM was shown to T = 4095, Q5_K's fragments from 4096): on the fake H200, 4096x14336, the register-A
    GEMM (its _cx build or not) at `last`, the prepared GEMM's fragments from `first`; every row up to T = 2304 as
    a scan of each T through ops.choose finds them."""
    from ptxgen.testing import fakegpu

    fakegpu.install(shipped_rule, dispatch.DEVICES["sm_90 H200"])
    has = lambda t, name: any(n.startswith(name) for n in _kernels(fmt, t))  # noqa: E731
    assert has(last, before) and not has(last, after), _kernels(fmt, last)
    assert has(first, after) and not has(first, before), _kernels(fmt, first)
    seqs = {t: " + ".join(dict.fromkeys(_kernels(fmt, t))) for t in range(1, 2305)}
    scanned = [[t, s] for t, s in seqs.items() if t == 1 or s != seqs[t - 1]]
    assert [first, seqs[first]] in scanned
    for tokens, label_slices in ((dispatch.TOKENS, False), (dispatch.DOC_TOKENS, True)):  # the golden's, the docs'
        runs = dispatch._runs(fmt, "exact", None, 4096, 14336, tokens, label_slices=label_slices)
        assert [r for r in runs if r[0] <= 2304] == scanned, (fmt, tokens)
    if (fmt, "exact", None, 4096, 14336) in dispatch.DOC_CASES:  # its rows in design.md (markdown() undoes the fake)
        start = max(t for t, _ in scanned if t <= last)
        doc = dispatch.markdown(shipped_rule)
        assert f"| {start}–{last} | {seqs[last]} |" in doc
        assert re.search(rf"\| (≥ {first}|{first}–\d+) \| {re.escape(seqs[first])} \|", doc), doc
