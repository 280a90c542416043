"""Test tiers and shared fixtures. L0/L1/L2 run anywhere; `gpu` (L3) tests skip with a reason when no
NVIDIA driver/GPU is present."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptxgen.testing import profiles

profiles.register()
from hypothesis import settings  # noqa: E402

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path | None:
    cand = [os.environ.get("PTXGEN_SHARED_DIR"), REPO / "shared", REPO.parent / "shared"]
    for c in cand:
        if c and (Path(c) / "testdata").is_dir():
            return Path(c)
    return None


def _gpu_reason() -> str | None:
    try:
        from ptxgen.runtime import driver as device

        device.current()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means "no usable GPU here"
        return f"no usable GPU: {e}"


_GPU_REASON: list = []


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for it in gpu_items:
            it.add_marker(skip)


@pytest.fixture(scope="session")
def ggml_ref() -> Path:
    d = shared_dir()
    if d is None:
        pytest.skip("../shared/testdata not found (set PTXGEN_SHARED_DIR)")
    return d / "testdata" / "ggml-ref"
