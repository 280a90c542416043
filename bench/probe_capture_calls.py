"""Probe: which CUDA driver calls mul_mat makes while torch captures a graph (a call that is unsafe in global capture
mode invalidates it). Runs test_gpu_mmq's cluster split-K sequence on one shape and logs, for every cuda.bindings
driver function called while the current stream captures, its name and the Python caller.
    python3 bench/probe_capture_calls.py q4_K 4096 4096 512 [rule]"""
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main():
    fmt, m, k, t = sys.argv[1], *map(int, sys.argv[2:5])
    rule = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    import torch
    from cuda.bindings import driver as drv

    import ptxgen.runtime as r
    from ptxgen import tuning
    from ptxgen.testing.strategies import random_raw
    from conftest import graph_replayed

    log = []
    for name in dir(drv):
        fn = getattr(drv, name)
        if name.startswith("cu") and callable(fn):
            def wrap(*a, _fn=fn, _name=name, **kw):
                if torch.cuda.is_current_stream_capturing():
                    where = [f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()[-6:-1]]
                    log.append((_name, where))
                return _fn(*a, **kw)
            setattr(drv, name, wrap)
    rng = np.random.default_rng(m + t)
    raw = random_raw(fmt, m, k, rng)
    w = r.QuantTensor.from_raw(fmt, raw, (m, k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    xt = torch.from_numpy(x).cuda()
    with tuning.override(mmq_cluster_split_max_splits=rule):
        print("plan", r.mul_mat_plan(w, t).kernels)
        y = r.mul_mat(w, xt)
        with tuning.override(mmq_cluster_split_max_splits=0):
            r.mul_mat(w, xt)
        r.mul_mat(w, xt)
        x16 = xt.half()
        r.mul_mat(w, x16)
        r.mul_mat(w, x16.float())
        try:
            got = graph_replayed(w, xt)  # tests/conftest.py's: warmed up on a side stream, captured, replayed
            print("captured; same bits:", np.array_equal(got.view(np.uint32), y.cpu().numpy().view(np.uint32)))
        except Exception as e:  # noqa: BLE001
            print("capture failed:", str(e).splitlines()[0])
    print(f"{len(log)} driver calls while capturing:")
    for name, where in log:
        print(" ", name, "<-", " <- ".join(reversed(where)))


if __name__ == "__main__":
    main()
