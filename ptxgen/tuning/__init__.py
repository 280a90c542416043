"""mul_mat's dispatch thresholds per GPU, as data: one JSON file per measured GPU (`h200.json`), each rule a value
and why (the measured crossover and its log in bench/results/). `runtime/ops.py` reads them through `for_sm`, and
docs/design.md's dispatch table is generated from them (`python -m ptxgen.testing.dispatch --markdown`).

A GPU without a file of its own runs the H200's rules (the only GPU measured so far). To try other values in a
running process: `with tuning.override(q4k_few_max_tokens=8): ...` (or `tuning.set(...)` / `tuning.reset()`);
launch plans made under the old values are not reused (the change bumps `knobs.generation()`).
"""
from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

from .. import knobs

_HERE = Path(__file__).resolve().parent
BY_SM = {90: "h200"}  # compute capability (major·10 + minor) → tuning file
DEFAULT = "h200"
_LOADED: dict[str, "Tuning"] = {}
_OVERRIDES: dict[str, object] = {}
_LOCK = threading.Lock()


class Tuning:
    """The rules of one GPU: `t.mmq_min_tokens` is a rule's value (an override wins), `t.why(name)` its reason."""

    def __init__(self, name: str, doc: dict):
        self.name, self.gpu, self._rules = name, doc["gpu"], doc["rules"]

    def __getattr__(self, rule: str):
        if rule.startswith("_"):
            raise AttributeError(rule)
        if rule in _OVERRIDES:
            return _OVERRIDES[rule]
        try:
            return self._rules[rule]["value"]
        except KeyError:
            raise AttributeError(f"no tuning rule {rule!r} (known: {', '.join(self._rules)})") from None

    def why(self, rule: str) -> str:
        return self._rules[rule]["why"]

    def names(self) -> list[str]:
        return list(self._rules)

    def __repr__(self) -> str:
        return f"Tuning({self.name!r}: {self.gpu}, {len(self._rules)} rules)"


def load(name: str) -> Tuning:
    """The tuning file `name` (h200, ...), read once."""
    t = _LOADED.get(name)
    if t is None:
        path = _HERE / f"{name}.json"
        if not path.exists():
            known = ", ".join(p.stem for p in sorted(_HERE.glob("*.json")))
            raise ValueError(f"no tuning file {name!r} (have: {known})")
        t = _LOADED.setdefault(name, Tuning(name, json.loads(path.read_text())))
    return t


def for_sm(sm: int) -> Tuning:
    """The rules a GPU of compute capability `sm` (90 for sm_90) runs: its own file, else the H200's."""
    return load(BY_SM.get(sm, DEFAULT))


def set(**values) -> None:  # noqa: A001 - tuning.set reads as what it does
    """Override rules in this process (every GPU's): `tuning.set(q4k_few_max_tokens=8)`; None removes one."""
    names = load(DEFAULT).names()
    with _LOCK:
        for name, v in values.items():
            if name not in names:
                raise ValueError(f"tuning.set: no rule {name!r} (known: {', '.join(names)})")
            if v is None:
                _OVERRIDES.pop(name, None)
            else:
                _OVERRIDES[name] = v
    knobs.set()  # bumps the generation the launch plans are keyed by


def reset() -> None:
    """Drop every override."""
    with _LOCK:
        _OVERRIDES.clear()
    knobs.set()


@contextlib.contextmanager
def override(**values):
    """`with tuning.override(mmq_cx_min_tokens=64): ...`: the rules take these values inside the block only."""
    with _LOCK:
        saved = dict(_OVERRIDES)
    set(**values)
    try:
        yield
    finally:
        with _LOCK:
            _OVERRIDES.clear()
            _OVERRIDES.update(saved)
        knobs.set()
