"""The weight constructors' errors for a careless caller: each names the mistake instead of failing deep inside
NumPy, and nothing that would decode to garbage is accepted silently (CPU only)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from ptxgen import formats
from ptxgen.runtime import QuantTensor

WEIGHT_FORMATS = [n for n, f in formats.FORMATS.items() if not f.activation]


def _w(m=4, k=512, scale=1.0):
    return (np.random.default_rng(0).standard_normal((m, k)) * scale).astype(np.float32)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_finite_weights_past_the_fp16_scales_are_refused(fmt):
    """ggml's quantizer writes blocks whose fp16 scale overflowed (every weight then decodes to inf / NaN); ptxgen
    refuses them, naming the first block, unless allow_nonfinite asks for ggml's bytes."""
    w = _w(scale=1.0)
    w[2, 300] = 3e9
    with pytest.raises(ValueError, match=r"fp16 scales overflow, the first at row 2, columns .*largest \|value\| 3e\+09"):
        QuantTensor.from_numpy(w, fmt)
    raw = formats.quantize(fmt, w, allow_nonfinite=True)
    assert not np.isfinite(formats.dequantize(fmt, raw, w.shape)[2]).all()
    QuantTensor.from_numpy(w * 1e-9, fmt)  # large but representable: accepted


@pytest.mark.parametrize("spelling", ["Q4_K", "q4_k", "q4_K"])
def test_format_names_in_any_letter_case(spelling):
    assert formats.get(spelling) is formats.FORMATS["q4_K"]
    assert QuantTensor.from_numpy(_w(), spelling).fmt == "q4_K"  # kept in ggml's spelling


def test_unknown_and_activation_formats_are_refused_as_weights():
    with pytest.raises(ValueError, match="unknown format 'q4_0'"):
        QuantTensor.from_numpy(_w(), "q4_0")
    with pytest.raises(ValueError, match="q8_1 is an activation format; weight tensors are q4_K"):
        QuantTensor.from_numpy(_w(), "q8_1")
    with pytest.raises(ValueError, match="activation format"):
        QuantTensor.from_raw("q8_1", np.zeros(4 * 16 * 36, np.uint8), (4, 512))


def test_shapes_and_argument_order_are_checked():
    raw = QuantTensor.from_numpy(_w(), "q4_K").raw()
    with pytest.raises(TypeError, match=r"shape must be a tuple of ints.*got 2048"):
        QuantTensor.from_raw("q4_K", raw, 2048)
    with pytest.raises(TypeError, match=r"shape must be a tuple of ints.*\(4\.5, 512\)"):
        QuantTensor.from_raw("q4_K", raw, (4.5, 512))
    assert QuantTensor.from_raw("q4_K", raw, (np.int64(4), 512)).shape == (4, 512)
    with pytest.raises(TypeError, match="the weights come first"):
        QuantTensor.from_numpy("q4_K", _w())
    with pytest.raises(ValueError, match=r"no empty dimension, got shape \(4, 0\)"):
        QuantTensor.from_numpy(_w()[:, :0], "q4_K")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_ptxgen_torch_without_torch_names_the_extra():
    r = subprocess.run([sys.executable, "-c", "import ptxgen.torch"], capture_output=True, text=True)
    assert r.returncode != 0 and "ptxgen.torch needs torch" in r.stderr and "[torch]" in r.stderr
