"""L3: the README's quick start, its GPU part included, runs as written."""
import subprocess
import sys

import pytest

from test_repo import quick_start_blocks

pytestmark = pytest.mark.gpu


def test_quick_start_on_the_gpu(tmp_path):
    pytest.importorskip("torch")
    _, cpu, gpu = quick_start_blocks()
    p = subprocess.run([sys.executable, "-c", cpu + "\n" + gpu], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert float(p.stdout.strip().splitlines()[-1]) < 1e-5
