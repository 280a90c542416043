"""mul_mat's and mul_mat_id's kernel choice, pinned: the plans over a grid of device × format × mode × arch × shape × T
(planned without a GPU) equal tests/data/dispatch.json. A deliberate change of the rule regenerates that file
(`python -m ptxgen.testing.dispatch > tests/data/dispatch.json`) and shows up in its diff, one case per line."""
import json
import os

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
