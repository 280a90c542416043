"""Probe: does a cuMemFree inside driver.relaxed_capture keep a torch (global-mode) CUDA-graph capture intact? It
does (H100, 2026-12-06: bench/results/h100_capfree_probe_*.log), so DeviceBuffer.__del__ now frees that way always
(driver._free_relaxed). Each case captures a mul_mat with a ptxgen buffer freed inside the capture: a raw cuMemFree
in the thread's global mode (loses the graph), inside relaxed_capture, held (driver.hold_frees), and dropped
(DeviceBuffer.__del__ as it is).
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
    for case in ("raw cuMemFree", "relaxed", "held", "dropped"):
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
                elif case == "raw cuMemFree":
                    ptr, bufs[0].ptr = bufs[0].ptr, 0
                    driver._drv().cuMemFree(ptr)
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
