"""Probe: does a cuMemFree inside driver.relaxed_capture keep a torch (global-mode) CUDA-graph capture intact? If it
does, DeviceBuffer.__del__ could free that way always, and a GC pass anywhere in the caller's capture code (the held
frees cover ptxgen's ops only: driver.HOLD_FREES) would no longer lose the graph. Each case captures a mul_mat with a
ptxgen buffer freed inside the capture: at once (expected to lose the graph), inside relaxed_capture, and held
(driver.hold_frees, freed after).
    python3 bench/probe_capture_free.py"""
import numpy as np


def main():
    import torch

    import ptxgen.runtime as r
    from ptxgen.runtime import driver
    from ptxgen.testing.strategies import random_raw

    raw = random_raw("q4_K", 512, 1024, np.random.default_rng(0))
    w = r.QuantTensor.from_raw("q4_K", raw, (512, 1024)).to_device()
    x = torch.randn(64, 1024, device="cuda")
    y = torch.empty(64, 512, device="cuda")
    want = r.mul_mat(w, x).cpu().numpy()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r.mul_mat(w, x, out=y)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for case in ("at once", "relaxed", "held"):
        bufs = [r.DeviceBuffer(1 << 20)]  # (dropped by bufs.clear())
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                r.mul_mat(w, x, out=y)
                if case == "relaxed":
                    with driver.relaxed_capture():
                        bufs.clear()
                elif case == "held":
                    driver.hold_frees(1)
                    bufs.clear()
                    driver.hold_frees(-1)
                else:
                    bufs.clear()
            y.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            same = np.array_equal(y.cpu().numpy().view(np.uint32), want.view(np.uint32))
            print(f"{case}: captured, replay {'gives the eager bits' if same else 'DIFFERS'}")
        except Exception as e:  # noqa: BLE001
            print(f"{case}: capture lost: {str(e).splitlines()[0][:160]}")
            torch.cuda.synchronize()
        driver.synchronize()
        print(f"   held after: {len(driver._HELD)}")


if __name__ == "__main__":
    main()
