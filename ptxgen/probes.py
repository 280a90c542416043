"""One probe instruction per `Arch` feature: a tiny PTX module that compiles exactly on the arches that
have the feature. `tests/test_arch.py` compiles each on every arch to keep the feature table honest."""
from __future__ import annotations

from .arch import Arch

_DECLS = """\t.reg .pred %p<4>;\n\t.reg .b32 %r<64>;\n\t.reg .f32 %f<64>;\n\t.reg .b64 %rd<8>;
\t.shared .align 128 .b8 smem[4096];\n\t.shared .align 8 .b64 mbar;\n"""

PROBES = {
    "mma_sync_f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0,%f1,%f2,%f3}, {%r0,%r1,%r2,%r3}, {%r4,%r5}, {%f4,%f5,%f6,%f7};",
    "mma_sync_s8": "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32 {%r8,%r9,%r10,%r11}, {%r0,%r1,%r2,%r3}, {%r4,%r5}, {%r12,%r13,%r14,%r15};",
    "ldmatrix": "mov.u32 %r20, smem; ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r0,%r1,%r2,%r3}, [%r20];",
    "cp_async": "mov.u32 %r20, smem; cp.async.cg.shared.global [%r20], [%rd0], 16; cp.async.commit_group; cp.async.wait_group 0;",
    "cp_async_bulk_tensor": "mov.u32 %r20, smem; mov.u32 %r21, mbar; cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r20], [%rd0, {%r1, %r2}], [%r21];",
    "mbarrier_try_wait": "mov.u32 %r21, mbar; mbarrier.try_wait.parity.shared::cta.b64 %p0, [%r21], %r1;",
    "mbarrier_expect_tx": "mov.u32 %r21, mbar; mbarrier.arrive.expect_tx.shared::cta.b64 %rd1, [%r21], 1024;",
    "wgmma": "wgmma.fence.sync.aligned; wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f0,%f1,%f2,%f3}, %rd2, %rd3, 1, 1, 1, 0, 0; wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0;",
    "stmatrix": "mov.u32 %r20, smem; stmatrix.sync.aligned.m8n8.x1.shared.b16 [%r20], {%r0};",
    "setmaxnreg": "setmaxnreg.inc.sync.aligned.u32 240;",
    "clusters": "mov.u32 %r30, %cluster_ctarank; barrier.cluster.arrive; barrier.cluster.wait;",
    "griddepcontrol": "griddepcontrol.launch_dependents; griddepcontrol.wait;",
}


def probe_ptx(arch: Arch, feature: str) -> str:
    body = PROBES[feature].replace("; ", ";\n\t")
    return (f".version {arch.ptx_version_str}\n.target {arch.name}\n.address_size 64\n\n"
            f".visible .entry probe(.param .u64 p)\n{{\n{_DECLS}\tld.param.u64 %rd0, [p];\n"
            f"\tld.global.u64 %rd2, [%rd0+64];\n\tld.global.u64 %rd3, [%rd0+72];\n\t{body}\n\tst.global.u32 [%rd0], %r0;\n\tst.global.f32 [%rd0+4], %f0;\n\tst.global.u32 [%rd0+8], %r8;\n"
            f"\tld.shared.u32 %r40, [smem];\n\tst.global.u32 [%rd0+12], %r40;\n\tret;\n}}\n")


def dynamic_smem_kernel(arch: Arch, nbytes: int = 64 * 1024):
    """A kernel that needs `nbytes` of dynamic shared memory: thread t writes t near the end of it, then
    reads back 255 − t into out[t]. Used to test the >48 KB opt-in."""
    from .builder import KernelBuilder
    from .ir import Imm, Mem

    b = KernelBuilder("dsmem_probe", arch, "dynamic shared memory probe", block=(256, 1, 1))
    out_p = b.param("out", "u64", "ptr:out")
    smem = b.dynamic_shared(nbytes)
    out = b.ptr(out_p)
    tid = b.special("tid.x")
    far = b.op("add.u32", b.op("mov.u32", smem), Imm(nbytes - 4096, "u32"))
    b.emit("st.shared.u32", Mem(b.op("mad.lo.u32", tid, Imm(4, "u32"), far)), tid)
    b.emit("bar.sync", Imm(0, "u32"))
    rev = b.op("sub.u32", Imm(255, "u32"), tid)
    v = b.op("ld.shared.u32", Mem(b.op("mad.lo.u32", rev, Imm(4, "u32"), far)))
    b.emit("st.global.u32", Mem(b.op("mad.wide.u32", tid, Imm(4, "u32"), out)), v)
    return b.finish()


def cluster_rank_kernel(arch: Arch):
    """Thread 0 of each CTA writes (its rank in the cluster, the cluster's index, the cluster size in CTAs)
    to out[3·ctaid ...]: checks a launch with cluster dimensions."""
    from .builder import KernelBuilder
    from .ir import Imm, Mem

    arch.require("clusters", "cluster_rank_kernel")
    b = KernelBuilder("cluster_probe", arch, "cluster launch probe", block=(32, 1, 1))
    out = b.ptr(b.param("out", "u64", "ptr:out"))
    cta = b.special("ctaid.x")
    vals = [b.special("cluster_ctarank"), b.special("clusterid.x"), b.special("cluster_nctarank")]
    lead = b.op("setp.eq.u32", b.special("tid.x"), Imm(0, "u32"))
    base = b.op("mad.wide.u32", cta, Imm(12, "u32"), out)
    for i, v in enumerate(vals):
        b.emit("st.global.u32", Mem(base, 4 * i), v, pred=lead)
    return b.finish()
