"""A stand-in for the GPU in CPU tests of the runtime's planning: `mul_mat_plan` and plan binding run their real
code against an H200-shaped context (sm_90, 132 SMs), kernels loaded as their emitted manifest entries, and device
memory at made-up addresses. Nothing launches: tests look at what a plan would launch."""
from __future__ import annotations

import numpy as np

from ptxgen.runtime import driver, kernels, tma
from ptxgen.runtime.driver import Context, DeviceBuffer, Function
from ptxgen.runtime.tensors import QuantTensor

H200 = Context(device=0, ctx=None, name="fake H200", sm=90, sm_count=132, max_smem_optin=227 * 1024,
               l2_bytes=60 << 20)
BASE = 0x7F0000000000


class FakeFunction(Function):
    """A kernel as its manifest describes it; the occupancy calculator answers from its meta (ctas_per_sm, else 1;
    times the build's block over a smaller one's), capped by the shared memory of the context's SM (its opt-in
    limit + 1 KB, 1 KB reserved per CTA)."""

    def __init__(self, entry: dict, arch: str, ctx: Context = H200):
        self.module, self.handle, self.name = None, 0, entry["kernel"]
        self.params, self.block = entry["params"], tuple(entry["block"])
        self.dynamic_smem, self.meta, self.arch = entry.get("dynamic_smem", 0), entry.get("meta", {}), arch
        self.static_smem, self.ctx = entry.get("static_smem", 0), ctx

    @property
    def address(self) -> int:
        return 0

    def resident_per_sm(self, threads=None, smem=None) -> int:
        per_cta = (self.dynamic_smem if smem is None else smem) + self.static_smem + 1024
        # a smaller block than the build's holds proportionally more CTAs (its registers and threads allow them)
        full = self.block[0] * self.block[1] * self.block[2]
        most = int(self.meta.get("ctas_per_sm", 1)) * max(1, full // (threads or full))
        return max(1, min(most, (self.ctx.max_smem_optin + 1024) // per_cta))

    def resident_clusters(self, size: int) -> int:
        return self.ctx.sm_count // size

    def smem_for_residency(self, n: int) -> int:
        return self.dynamic_smem + 1024


def install(monkeypatch, ctx: Context = H200) -> list:
    """Patch the runtime to plan for `ctx` without a GPU; returns the list the fake `kernels.load` appends names to."""
    loaded: list = []

    def load(kernel, arch=None, source="emitted"):
        a = arch or kernels.build_for(kernel)
        if a is None:
            raise kernels.KernelNotFound(f"kernel {kernel!r} has no build for the fake sm_{ctx.sm}")
        loaded.append(kernel)
        return FakeFunction(kernels.entry(kernel, a), a, ctx)

    current = lambda: ctx  # noqa: E731
    monkeypatch.setattr(driver, "current", current)
    monkeypatch.setattr(kernels, "current", current)
    monkeypatch.setattr(kernels, "load", load)
    monkeypatch.setattr(driver, "capture_id", lambda stream: None)

    def fake_map(ptr, dtype, rows, cols, box_rows, box_cols, swizzle="128B", row_stride_bytes=None, chunks=0):
        tma.check_tensor_map_2d(ptr, dtype, rows, cols, box_rows, box_cols, swizzle, row_stride_bytes, chunks)
        return bytes(128)

    monkeypatch.setattr(tma, "tensor_map_2d", fake_map)
    from ..runtime import ops

    spaces: dict = {}  # the ops' eager workspaces: made-up addresses, one per plan (nothing allocated)
    monkeypatch.setattr(ops, "eager_bound", lambda plan, stream: plan.bound(
        spaces.setdefault(id(plan), (plan, FakeWorkspace(plan)))[1]))
    return loaded


def weights(fmt: str, m: int, k: int, at: int = BASE, max_scale: float | None = None, experts: int = 0) -> QuantTensor:
    """A QuantTensor 'on the device' at a made-up address (nothing is read from it); `max_scale` as
    QuantTensor's; `experts` > 0: (experts, m, k), mul_mat_id's weights."""
    from ptxgen import formats

    n = max(experts, 1) * m * formats.get(fmt).row_bytes(k)
    shape = (experts, m, k) if experts else (m, k)
    return QuantTensor(fmt, shape, device=DeviceBuffer.wrap(at, n), max_scale=max_scale)


class FakeWorkspace:
    """Shaped like a plans.Workspace (its addresses made up), for binding plans without a GPU."""

    def __init__(self, plan, base: int = BASE + (1 << 36)):
        from ptxgen.runtime.plans import STATE_HEAD

        c = max(plan.counter_bytes, 1 << 16)
        self.counter_bytes = c
        self.addr = {"flag": base, "done": base + 4, "queue": base + 8, "counters": base + STATE_HEAD,
                     "ready": base + STATE_HEAD + c}
        self.scratch_ptr = base + (1 << 30)
        self.epoch = 0  # plans.Workspace bumps it when reserve() moves its memory


def arrays_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))
