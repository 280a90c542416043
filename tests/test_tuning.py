"""The dispatch thresholds as data (ptxgen/tuning): every rule has a value and the measurement behind it, the runtime
reads exactly the rules the files hold, and an override reaches the plans."""
import re
from pathlib import Path

import pytest

from ptxgen import knobs, tuning
from ptxgen.runtime import ops
from ptxgen.testing import fakegpu

OPS = (Path(__file__).resolve().parent.parent / "runtime" / "ops.py").read_text()


def test_every_rule_has_a_value_and_a_reason():
    h200 = tuning.load("h200")
    assert "H200" in h200.gpu and h200.names()
    for name in h200.names():
        v = getattr(h200, name)
        assert isinstance(v, int) or (isinstance(v, dict) and all(isinstance(x, int) for x in v.values())), name
        assert len(h200.why(name)) > 40, name  # a reason, with numbers or a log


def _decode_rules() -> set:
    """The rules the codecs' DECODE data names (runtime/ops.py _decode reads them through it) and the rules kernel
    builds name in their meta (k_parts_rule: runtime/ops.py _split_grid reads it)."""
    from ptxgen import codecs
    from ptxgen.runtime import kernels

    out = set()
    for c in codecs.CODECS.values():
        d = getattr(c, "DECODE", {})
        out |= {d["mma_min"][0], d["mma_min"][2]} if "mma_min" in d else set()
        out |= {d["few_min_weights"]} if "few_min_weights" in d else set()
    for arch in ("sm_89", "sm_90a", "sm_120a"):  # every shipped build's meta, as the runtime loads it
        out |= {k["meta"]["k_parts_rule"] for k in kernels.manifest(arch).values() if "k_parts_rule" in k["meta"]}
    return out


def test_the_runtime_reads_exactly_the_rules_the_file_holds():
    used = set(re.findall(r"RULES\.([a-z0-9_]+)", OPS)) | _decode_rules()
    assert used == set(tuning.load("h200").names())


def test_unknown_rules_and_files_are_refused():
    with pytest.raises(ValueError, match="no rule 'mmq_min_tokenz'"):
        tuning.set(mmq_min_tokenz=3)
    with pytest.raises(ValueError, match="no tuning file 'a100'"):
        tuning.load("a100")
    with pytest.raises(AttributeError, match="no tuning rule"):
        tuning.load("h200").no_such_rule
    assert tuning.for_sm(89) is tuning.load("h200")  # unmeasured GPUs run the H200's rules


def test_an_override_reaches_the_plans_and_ends_with_the_block(monkeypatch):
    fakegpu.install(monkeypatch)
    w = fakegpu.weights("q4_K", 4096, 14336)
    before = ops.mul_mat_plan(w, 1).kernels
    gen = knobs.generation()
    with tuning.override(q4k_t1_min_weights=1 << 40):  # the few-token builds need more weights than this matrix has
        assert knobs.generation() != gen
        assert ops.RULES.q4k_t1_min_weights == 1 << 40
        assert ops.mul_mat_plan(w, 1).kernels != before
    assert ops.mul_mat_plan(w, 1).kernels == before == ["gemv_q4_k_i8_t1_fused"]
    tuning.set(q4k_few_max_tokens=2)
    assert ops.mul_mat_plan(w, 3).kernels == ["prep_mma_f16", "gemv_q4_k_mma"]
    tuning.reset()
    assert ops.mul_mat_plan(w, 3).kernels == ["gemv_q4_k_mma_t4_fused"]


def test_the_codecs_capability_data_names_what_exists():
    """The data the shared builders and the runtime read from a codec by name (absent means "no"): DECODE's keys are
    the ones ops._decode reads, its knobs and kernels exist, and the capability flags have their types — a
    misspelt key or flag would otherwise read as absent."""
    from ptxgen import codecs
    from ptxgen.kernels import KERNELS

    keys = {"mma_knob", "mma_min", "few_knob", "few_min_weights", "xr", "mma_needs_tma", "lane_tma"}
    rules = set(tuning.load("h200").names())
    for fmt, c in codecs.CODECS.items():
        d = getattr(c, "DECODE", None)
        if d is not None:
            assert set(d) <= keys, (fmt, set(d) - keys)
            assert all(callable(getattr(knobs, d[key])) for key in ("mma_knob", "few_knob") if key in d)
            big, n, small = d["mma_min"]
            assert {big, small} <= rules and isinstance(n, int)
            assert d.get("few_min_weights", big) in rules and d.get("xr", "gemv_q4_k_xr") in KERNELS
            assert "decode" in c.ROUTES["exact"]
        for flag in ("RAW_RING", "Q8_MMQ", "WGMMA_ALL"):
            assert isinstance(getattr(c, flag, False), bool), (fmt, flag)
        assert getattr(c, "NIBBLE_COLUMNS", 3) in (3, 5), fmt
