"""mul_mat's kernel choice, pinned: the plans over a grid of device × format × mode × arch × shape × T (planned
without a GPU) equal tests/data/dispatch.json. A deliberate change of the rule regenerates that file
(`python -m ptxgen.testing.dispatch > tests/data/dispatch.json`) and shows up in its diff, one case per line."""
import json

from conftest import DATA
from ptxgen.testing import dispatch


def test_dispatch_is_the_golden_table(monkeypatch):
    for var in ("PTXGEN_Q4K_MMA", "PTXGEN_Q4K_T1", "PTXGEN_Q4K_FUSED", "PTXGEN_Q4K_T16H", "PTXGEN_Q4K_XR", "PTXGEN_TQ4_MMA", "PTXGEN_MMQ_SKINNY",
                "PTXGEN_MMQ_REGA", "PTXGEN_MMQ_CX", "PTXGEN_MMQ_PRE", "PTXGEN_MMQ_X16", "PTXGEN_MMQ_TAIL_SPLIT"):
        monkeypatch.delenv(var, raising=False)  # the rule as shipped: every knob on auto
    from ptxgen import knobs

    knobs.reload()
    golden = json.loads((DATA / "dispatch.json").read_text())
    got = json.loads(dispatch.dumps(dispatch.table(monkeypatch)))
    changed = [k for k in golden if got.get(k) != golden[k]] + [k for k in got if k not in golden]
    assert not changed, f"{len(changed)} cases differ from tests/data/dispatch.json, e.g. {changed[0]}: " \
                        f"{got.get(changed[0])} (golden {golden.get(changed[0])})"


def test_the_design_docs_dispatch_section_is_generated_from_the_rule(monkeypatch):
    """docs/design.md's dispatch table and thresholds are `python -m ptxgen.testing.dispatch --markdown`'s output."""
    from pathlib import Path

    from ptxgen import knobs

    for var in [v for v in __import__("os").environ if v.startswith("PTXGEN_")]:
        monkeypatch.delenv(var, raising=False)
    knobs.reload()
    doc = (Path(__file__).resolve().parent.parent / "docs" / "design.md").read_text()
    want = dispatch.markdown(monkeypatch)
    a, b = doc.find(dispatch.BEGIN), doc.find(dispatch.END)
    assert a >= 0 and b > a and doc.count(dispatch.BEGIN) == doc.count(dispatch.END) == 1, \
        "docs/design.md must hold its generated dispatch section once"
    assert doc[a:b + len(dispatch.END)] + "\n" == want, \
        "docs/design.md's dispatch section is stale: python -m ptxgen.testing.dispatch --markdown"
