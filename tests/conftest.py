"""Test tiers and shared fixtures.

`python3 -m pytest` runs the fast tier: everything but the tests marked `slow` (the thorough emulator and
hypothesis runs) and, on a machine without a usable GPU, the `gpu` tier (one line in the summary says why).
`python3 -m pytest --all` runs the slow tests too; `-m gpu` the GPU tier alone; `-m slow` the slow tests alone.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptxgen import knobs, tuning
from ptxgen.testing import accuracy, profiles

profiles.register()
from hypothesis import settings  # noqa: E402

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="also run the tests marked slow (the thorough emulator and hypothesis runs)")


def _gpu_reason() -> str | None:
    try:
        from ptxgen.runtime import driver as device

        device.current()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "no usable GPU here"
        return f"no usable GPU: {e}"


_NOT_RUN: list = []  # (count, why) of the tiers left out, for the summary


def pytest_collection_modifyitems(config, items):
    markexpr = config.getoption("markexpr") or ""
    keep, dropped = [], {"slow": [], "gpu": []}
    gpu_reason = None
    if any("gpu" in it.keywords for it in items):
        gpu_reason = _gpu_reason()
    for it in items:
        if "slow" in it.keywords and not config.getoption("--all") and "slow" not in markexpr:
            dropped["slow"].append(it)
        elif "gpu" in it.keywords and gpu_reason:
            dropped["gpu"].append(it)
        else:
            keep.append(it)
    if dropped["slow"] or dropped["gpu"]:
        config.hook.pytest_deselected(items=dropped["slow"] + dropped["gpu"])
        items[:] = keep
    if dropped["slow"]:
        _NOT_RUN.append((len(dropped["slow"]), "slow tier (thorough emulator / hypothesis runs): add --all"))
    if dropped["gpu"]:
        _NOT_RUN.append((len(dropped["gpu"]), f"gpu tier: {gpu_reason}"))


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its tally of the tiers left out to the controller (each worker collects every
    test, so one worker's tally is the run's)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["ptxgen_not_run"] = list(_NOT_RUN)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pytest-xdist, in the controller
    if not _NOT_RUN:
        _NOT_RUN.extend(tuple(x) for x in getattr(node, "workeroutput", {}).get("ptxgen_not_run", []))


def pytest_terminal_summary(terminalreporter):
    for n, why in _NOT_RUN:
        terminalreporter.write_line(f"not run: {n} tests of the {why}")


@pytest.fixture(autouse=True)
def _fresh_knobs():
    """Each test starts from the environment's knob values and the tuning files' rules (a test that sets a knob
    with `setknob` or a rule with `tuning.set` leaves nothing)."""
    yield
    tuning.reset()
    knobs.reload()


def rel(got, want, scale=None) -> float:
    """‖got − want‖ / ‖want‖ in float64: the GPU tests' accuracy measure against their float64 references; with
    `scale` (accuracy.product_scale), ‖got − want‖ / max(‖want‖, ‖scale‖), so that a few outputs whose sums cancel
    are held to the rounding their terms allow (ptxgen.testing.accuracy)."""
    return accuracy.rel_error(got, want, scale)


def rel_ref(got, fmt: str, raw, m: int, k: int, x) -> float:
    """rel of `got` against formats.gemm_ref(fmt, raw, m, k, x), scaled by the products' magnitude: M = T = 1 with
    fp16 x alone exceeds 1e-3 in ~15% of random draws by the unscaled measure (accuracy.gemm_rel_error)."""
    return accuracy.gemm_rel_error(got, fmt, raw, m, k, x)


def graph_replayed(w, xt):
    """mul_mat(w, xt) captured into a CUDA graph on torch's stream (warmed up on a side stream, as torch
    recommends), its output NaN-filled, then replayed: the output as NumPy."""
    import torch

    import ptxgen.runtime as r

    yt = torch.empty((xt.shape[0], w.shape[0]), device="cuda")
    s_ = torch.cuda.Stream()
    s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        r.mul_mat(w, xt, out=yt)
    torch.cuda.current_stream().wait_stream(s_)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r.mul_mat(w, xt, out=yt)
    yt.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return yt.cpu().numpy()


def setknob(mp, name: str, value) -> None:
    """Set (or with None unset) a PTXGEN_ knob for the rest of a test, in process (knobs.set: the kernel choices are
    not read from the environment); _fresh_knobs forgets it after the test. `mp` (a MonkeyPatch) is unused."""
    knobs.set(**{name: value})


@pytest.fixture(scope="session")
def ggml_ref() -> Path:
    """Outputs of ggml's own quantizers (tests/data/ggml-ref/README.md says how they were made)."""
    return DATA / "ggml-ref"
