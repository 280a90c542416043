"""The emulator's Hopper instructions (mbarrier, TMA, wgmma, setmaxnreg, named barriers, suspension of
waiting threads) against hand-computed results, and the errors that catch a missing wait. The expected
layouts here are written out from the PTX ISA's tables, not taken from ptxgen.layouts."""
import re

import numpy as np
import pytest

from ptxgen.emu import EmulationError, Emulator, Memory
from ptxgen.emu.harness import check_kernel
from ptxgen.emu.hopper import tensor_map_2d
from ptxgen.kernels import KERNELS

HEADER = """.version 8.7
.target sm_90a
.address_size 64
.visible .entry t(
\t.param .u64 out,
\t.param .align 64 .b8 tmap[128]
)
{
\t.reg .pred %p<8>;
\t.reg .b32 %r<64>;
\t.reg .f32 %f<80>;
\t.reg .b64 %rd<16>;
\t.shared .align 1024 .b8 sm[32768];
"""


def run(body: str, threads: int, out, tmap=bytes(128), seed=None):
    ptx = HEADER + "\tmov.u32 %r31, %tid.x;\n\tld.param.u64 %rd15, [out];\n\tmov.u32 %r30, sm;\n" + \
        "\n".join("\t" + line for line in body.strip().splitlines()) + "\n\tret;\n}\n"
    mem = Memory()
    o = mem.alloc(out) if not isinstance(out, int) else mem.alloc(out, poison=0xFF)
    emu = Emulator(ptx)
    emu.run((1,), (threads,), (o, tmap if not callable(tmap) else tmap(mem)), mem, seed=seed)
    return mem, o


def test_nanosleep_in_a_spin_lets_the_other_warps_of_the_cta_run():
    """A spin loop with nanosleep (the converting MMQ's throttle) waits for a store by a warp whose code sits at
    higher pcs: the emulator runs the lowest pc first, so without the sleep's yield the spinner would spin until
    the step limit; with it, warp 1 stores, warp 0 sees it and copies it out."""
    body = """
setp.lt.u32 %p1, %r31, 32;
@!%p1 bra $L_writer;
$L_spin:
ld.relaxed.gpu.global.u32 %r2, [%rd15];
setp.eq.u32 %p2, %r2, 0;
@%p2 nanosleep.u32 100;
@%p2 bra $L_spin;
st.global.u32 [%rd15+4], %r2;
bra $L_end;
$L_writer:
setp.eq.u32 %p3, %r31, 32;
@%p3 st.global.u32 [%rd15], 7;
$L_end:
"""
    mem, o = run(body, 64, np.zeros(2, np.uint32))
    assert mem.view(o, np.uint32, (2,)).tolist() == [7, 7]
    with pytest.raises(EmulationError, match="step limit"):  # the same spin without the sleep never lets go
        Emulator(HEADER + "\tmov.u32 %r31, %tid.x;\n\tld.param.u64 %rd15, [out];\n" +
                 "\n".join("\t" + ln for ln in body.strip().splitlines() if "nanosleep" not in ln) +
                 "\n\tret;\n}\n").run((1,), (64,), (mem.alloc(np.zeros(2, np.uint32)), bytes(128)), mem,
                                         max_steps=20_000)


def test_mbarrier_phases_parity_and_arrival_state():
    """A phase completes with its last arrival; `test_wait.parity P` is true once the phase of parity P
    has completed (so parity 1 reads as complete before any phase did, the producer's start trick)."""
    body = """
setp.eq.u32 %p1, %r31, 0;
@%p1 mbarrier.init.shared::cta.b64 [%r30], 32;
bar.sync 0;
mbarrier.test_wait.parity.shared::cta.b64 %p2, [%r30], 0;
mbarrier.test_wait.parity.shared::cta.b64 %p3, [%r30], 1;
mbarrier.arrive.shared::cta.b64 %rd1, [%r30];
mbarrier.test_wait.parity.shared::cta.b64 %p4, [%r30], 0;
mbarrier.test_wait.parity.shared::cta.b64 %p5, [%r30], 1;
selp.u32 %r1, 1, 0, %p2;
selp.u32 %r2, 1, 0, %p3;
selp.u32 %r3, 1, 0, %p4;
selp.u32 %r4, 1, 0, %p5;
mul.wide.u32 %rd2, %r31, 16;
add.s64 %rd3, %rd15, %rd2;
st.global.v4.u32 [%rd3], {%r1, %r2, %r3, %r4};
"""
    mem, o = run(body, 32, 32 * 16)
    np.testing.assert_array_equal(mem.view(o, np.uint32, (32, 4)), np.tile([0, 1, 1, 0], (32, 1)))


PRODUCER_CONSUMER = """
setp.eq.u32 %p1, %r31, 0;
@%p1 mbarrier.init.shared::cta.b64 [%r30], 1;
bar.sync 0;
setp.lt.u32 %p2, %r31, 32;
@%p2 bra.uni $L_producer;
$L_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r30], 0;
@!%p3 bra $L_wait;
ld.shared.u32 %r5, [%r30+64];
sub.u32 %r6, %r31, 32;
mul.wide.u32 %rd2, %r6, 4;
add.s64 %rd3, %rd15, %rd2;
st.global.u32 [%rd3], %r5;
ret;
$L_producer:
mov.u32 %r7, 42;
@%p1 st.shared.u32 [%r30+64], %r7;
{arrive}
"""


def test_try_wait_suspends_until_the_producer_arrives():
    """The consumer warp's wait comes first in program order; it must yield to the producer warp."""
    mem, o = run(PRODUCER_CONSUMER.replace("{arrive}", "@%p1 mbarrier.arrive.shared::cta.b64 %rd1, [%r30];"), 64, 32 * 4)
    np.testing.assert_array_equal(mem.view(o, np.uint32, (32,)), 42)


def test_a_wait_nobody_satisfies_is_a_deadlock_error():
    with pytest.raises(EmulationError, match=r"deadlock(.|\n)*try_wait(.|\n)*0 of 1 arrivals|deadlock(.|\n)*1 of 1 arrivals"):
        run(PRODUCER_CONSUMER.replace("{arrive}", ""), 64, 32 * 4)


def test_named_barriers_with_thread_counts():
    """Two warpgroups sync on barriers 1 and 2 (128 threads each) at the same instruction; a barrier
    whose count is never reached is a deadlock."""
    body = """
shr.u32 %r1, %r31, 7;
add.u32 %r2, %r1, 1;
mul.lo.u32 %r3, %r31, 4;
add.u32 %r4, %r30, %r3;
st.shared.u32 [%r4], %r31;
bar.sync %r2, 128;
xor.b32 %r5, %r31, 127;
mul.lo.u32 %r6, %r5, 4;
add.u32 %r7, %r30, %r6;
ld.shared.u32 %r8, [%r7];
mul.wide.u32 %rd2, %r31, 4;
add.s64 %rd3, %rd15, %rd2;
st.global.u32 [%rd3], %r8;
"""
    mem, o = run(body, 256, 256 * 4)
    np.testing.assert_array_equal(mem.view(o, np.uint32, (256,)), np.arange(256) ^ 127)
    with pytest.raises(EmulationError, match="deadlock"):
        run(body.replace("bar.sync %r2, 128", "bar.sync %r2, 160"), 256, 256 * 4)


def tma_body(box_bytes):
    return f"""
setp.eq.u32 %p1, %r31, 0;
add.u32 %r1, %r30, 16384;
@%p1 mbarrier.init.shared::cta.b64 [%r1], 1;
bar.sync 0;
mov.b64 %rd1, tmap;
cvta.param.u64 %rd2, %rd1;
mov.u32 %r2, 32;
mov.u32 %r3, 1;
@%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r1], {box_bytes};
@%p1 cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r30], [%rd2, {{%r2, %r3}}], [%r1];
$L_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r1], 0;
@!%p3 bra $L_wait;
mul.lo.u32 %r4, %r31, 16;
add.u32 %r5, %r30, %r4;
ld.shared.v4.u32 {{%r6, %r7, %r8, %r9}}, [%r5];
mul.wide.u32 %rd4, %r31, 16;
add.s64 %rd5, %rd15, %rd4;
st.global.v4.u32 [%rd5+4096], {{%r6, %r7, %r8, %r9}};
"""


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_tma_box_lands_swizzled_with_zero_fill(seed):
    """An 8 x 64 fp16 box at (col 32, row 1) of a 5 x 80 tensor, 128B swizzle: box row r sits at bytes
    128 r with its 16-byte chunk j at chunk j ^ (r % 8); elements outside the tensor read as zero."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((5, 80)).astype(np.float16)
    out = np.concatenate([g.view(np.uint8).reshape(-1), np.zeros(4096 - g.nbytes + 64 * 16, np.uint8)])

    def tmap(mem):
        return tensor_map_2d(mem.bases[0], "f16", 5, 80, 8, 64, "128B")

    mem, o = run(tma_body(1024), 64, out, tmap, seed)
    smem = mem.view(o, np.uint8, (4096 + 1024,))[4096:].reshape(8, 8, 16)  # [row, chunk, byte]
    want_box = np.zeros((8, 64), np.float16)
    want_box[:4, :48] = g[1:5, 32:80]
    want = want_box.view(np.uint8).reshape(8, 8, 16)
    for r in range(8):
        for j in range(8):
            np.testing.assert_array_equal(smem[r, j ^ (r % 8)], want[r, j], err_msg=f"row {r} chunk {j}")


@pytest.mark.parametrize("seed", [None, 1])
def test_tma_3d_box_of_column_chunks_lands_chunk_after_chunk(seed):
    """A column-chunked map (tensor_map_2d chunks=2: the 5 x 192 fp16 tensor seen as (64-column chunk, row,
    chunk)): the 3-D box at (0, row 1, chunk 1) is chunks 1 and 2's 8 x 64 tiles one after another in shared memory,
    each 128B-swizzled as a 2-D box, rows past the tensor zero; chunk 3 is past it (zero too)."""
    rng = np.random.default_rng(1)
    g = rng.standard_normal((5, 192)).astype(np.float16)
    out = np.concatenate([g.view(np.uint8).reshape(-1), np.zeros(4096 - g.nbytes + 2 * 64 * 16, np.uint8)])

    def tmap(mem):
        return tensor_map_2d(mem.bases[0], "f16", 5, 192, 8, 64, "128B", None, 2)

    body = tma_body(2048).replace("tensor.2d", "tensor.3d").replace("{%r2, %r3}", "{%r10, %r3, %r3}")
    body = "mov.u32 %r10, 0;\n" + body
    mem, o = run(body, 128, out, tmap, seed)
    smem = mem.view(o, np.uint8, (4096 + 2048,))[4096:].reshape(2, 8, 8, 16)  # [chunk, row, 16-byte part, byte]
    for c in range(2):
        want_box = np.zeros((8, 64), np.float16)
        want_box[:4] = g[1:5, 64 * (c + 1):64 * (c + 2)]
        want = want_box.view(np.uint8).reshape(8, 8, 16)
        for r in range(8):
            for j in range(8):
                np.testing.assert_array_equal(smem[c, r, j ^ (r % 8)], want[r, j], err_msg=f"chunk {c} row {r}")
    with pytest.raises(EmulationError, match="3-D copy through a tensor map with chunks=0"):
        run(body, 128, out, lambda mem: tensor_map_2d(mem.bases[0], "f16", 5, 192, 8, 64, "128B"))


def test_tma_prefetch_to_l2_moves_nothing_and_checks_its_box():
    """cp.async.bulk.prefetch.tensor.2d.L2 (the grouped MoE GEMMs' weights while the grouping runs): no bytes move,
    no barrier is involved, rows past the tensor are allowed; the box must start 16-byte aligned in the row."""
    g = np.arange(5 * 80, dtype=np.float16).reshape(5, 80)
    out = np.concatenate([g.view(np.uint8).reshape(-1), np.zeros(4096 - g.nbytes + 1024, np.uint8)])
    body = """
mov.b64 %rd1, tmap;
cvta.param.u64 %rd2, %rd1;
mov.u32 %r2, COL;
mov.u32 %r3, 7;
cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%rd2, {%r2, %r3}];
"""

    def tmap(mem):
        return tensor_map_2d(mem.bases[0], "f16", 5, 80, 8, 64, "128B")

    mem, o = run(body.replace("COL", "8"), 32, out, tmap)
    np.testing.assert_array_equal(mem.view(o, np.uint8, (out.size,)), out)
    with pytest.raises(EmulationError, match="not 16-byte aligned"):
        run(body.replace("COL", "4"), 32, out, tmap)
    with pytest.raises(EmulationError, match="2-D prefetch through a tensor map with chunks=2"):
        run(body.replace("COL", "8"), 32, out, lambda mem: tensor_map_2d(mem.bases[0], "f16", 5, 192, 8, 64, "128B",
                                                                         None, 2))


def test_tma_expect_tx_short_of_the_box_deadlocks_or_overflows():
    """expect_tx of fewer bytes than the box: the phase completes early (tx goes negative) — the
    emulator must not complete it; it waits for the count to return to zero, so this deadlocks."""
    out = np.zeros(4096 + 1024, np.uint8)

    def tmap(mem):
        return tensor_map_2d(mem.bases[0], "f16", 5, 80, 8, 64, "128B")

    with pytest.raises(EmulationError, match="deadlock"):
        run(tma_body(2048), 64, out, tmap)


def _sw128(r, byte):
    """Byte `byte` (0..127) of row r of a K-major 128B-swizzled tile (1024-byte aligned)."""
    return (r // 8) * 1024 + (r % 8) * 128 + (((byte // 16) ^ (r % 8)) * 16) + byte % 16


def wgmma_program(n, wait=True):
    """128 threads: copy the A (64 x 64 f16) and B (n x 64 f16) images to shared memory, then 4 wgmma
    m64nNk16 stepping the descriptors by +32 bytes along K, and store the accumulators."""
    regs = ", ".join(f"%f{i}" for i in range(n // 2))
    lines = ["mov.u32 %r1, 0;", "$L_copy:", "mad.lo.u32 %r2, %r1, 128, %r31;", "mul.lo.u32 %r3, %r2, 16;",
             "cvt.u64.u32 %rd1, %r3;", "add.s64 %rd2, %rd15, %rd1;", "ld.global.v4.u32 {%r4, %r5, %r6, %r7}, [%rd2];",
             "add.u32 %r8, %r30, %r3;", "st.shared.v4.u32 [%r8], {%r4, %r5, %r6, %r7};", "add.u32 %r1, %r1, 1;",
             f"setp.lt.u32 %p1, %r1, {-(-(8192 + n * 128) // 2048)};", "@%p1 bra.uni $L_copy;", "bar.sync 0;",
             "fence.proxy.async.shared::cta;"]
    lines += [f"mov.f32 %f{i}, 0f3F800000;" for i in range(n // 2)]  # D starts at 1.0 (scale-d = 1 keeps it)
    lines += ["shr.u32 %r9, %r30, 4;", "cvt.u64.u32 %rd3, %r9;", "or.b64 %rd4, %rd3, 0x4000004000010000;",
              "add.s64 %rd5, %rd4, 512;", "wgmma.fence.sync.aligned;"]
    for kk in range(4):
        lines += [f"add.s64 %rd6, %rd4, {2 * kk};", f"add.s64 %rd7, %rd5, {2 * kk};",
                  f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{regs}}}, %rd6, %rd7, 1, 1, 1, 0, 0;"]
    lines += ["wgmma.commit_group.sync.aligned;"] + (["wgmma.wait_group.sync.aligned 0;"] if wait else [])
    lines += [f"mul.wide.u32 %rd8, %r31, {2 * n};", "add.s64 %rd9, %rd15, %rd8;"]
    lines += [f"st.global.f32 [%rd9+{16384 + 4 * i}], %f{i};" for i in range(n // 2)]
    return "\n".join(lines)


@pytest.mark.parametrize("n", [8, 32, 64])
def test_wgmma_from_swizzled_shared_memory(n):
    rng = np.random.default_rng(n)
    A = rng.integers(-8, 8, (64, 64)).astype(np.float16)
    B = rng.integers(-8, 8, (n, 64)).astype(np.float16)
    img = np.zeros(8192 + n * 128, np.uint8)
    for mat, base in ((A, 0), (B, 8192)):
        raw = mat.view(np.uint8)  # [rows, 128 bytes]
        for r in range(mat.shape[0]):
            for byte in range(128):
                img[base + _sw128(r, byte)] = raw[r, byte]
    out = np.concatenate([img, np.zeros(16384 - img.size + 128 * 2 * n, np.uint8)])
    mem, o = run(wgmma_program(n), 128, out)
    acc = mem.view(o, np.uint8, (out.size,))[16384:].view(np.float32).reshape(128, n // 2)
    # D fragment (PTX ISA, wgmma .m64nNk16 D): warp w holds rows 16w..16w+15; register i of lane l is
    # row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2
    D = np.zeros((64, n), np.float32)
    for t in range(128):
        w, lane = divmod(t, 32)
        for i in range(n // 2):
            D[16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = acc[t, i]
    np.testing.assert_array_equal(D, A.astype(np.float32) @ B.astype(np.float32).T + 1)


def test_reading_an_accumulator_before_wgmma_wait_is_an_error():
    out = np.zeros(16384 + 128 * 64, np.uint8)
    with pytest.raises(EmulationError, match="in flight"):
        run(wgmma_program(32, wait=False), 128, out)


def test_setmaxnreg_checks_count_and_convergence():
    run("setmaxnreg.dec.sync.aligned.u32 40;", 128, 16)
    with pytest.raises(EmulationError, match="multiple of 8"):
        run("setmaxnreg.inc.sync.aligned.u32 260;", 128, 16)
    with pytest.raises(EmulationError, match="not converged"):
        run("setp.lt.u32 %p1, %r31, 64;\n@%p1 bra $L_x;\nsetmaxnreg.dec.sync.aligned.u32 40;\n$L_x:", 128, 16)


# --- the sm_90a MMQ in the emulator: missing waits and broken layouts must fail ----------------------------

def _wgmma_mmq_ptx():
    return KERNELS["mmq_q4_k_wgmma_n32"].for_arch("sm_90a").ptx()


def test_wgmma_mmq_without_the_final_wait_group_fails():
    ptx = _wgmma_mmq_ptx().replace("wgmma.wait_group.sync.aligned 0;", "")
    with pytest.raises(EmulationError, match="in flight"):
        check_kernel("mmq_q4_k_wgmma_n32", ptx, seed=0)


def test_wgmma_mmq_whose_consumer_skips_the_full_barrier_wait_fails():
    """Drop the consumers' wait on the 'stage full' mbarrier: they read the stage before TMA lands."""
    ptx = _wgmma_mmq_ptx()
    lines = ptx.splitlines()
    waits = [i for i, x in enumerate(lines) if "mbarrier.try_wait" in x]
    i = waits[-1]  # the consumers' per-K-step wait comes last in program order
    pred = re.search(r"try_wait\S* (%p\d+),", lines[i]).group(1)
    lines[i] = f"\tsetp.eq.u32 {pred}, 0, 0;"
    with pytest.raises(EmulationError, match="nothing wrote"):
        check_kernel("mmq_q4_k_wgmma_n32", "\n".join(lines) + "\n", seed=0)


def test_wgmma_mmq_with_an_unswizzled_descriptor_is_wrong():
    ptx = _wgmma_mmq_ptx().replace("0x4000004000010000", "0x0000004000010000")
    out = check_kernel("mmq_q4_k_wgmma_n32", ptx, seed=0)
    assert not out.ok, out.detail


def test_wgmma_mmq_with_a_broken_dequant_sequence_fails(monkeypatch):
    """Reverse the order of the qs words fed to the shared dequant sequence: weights land at wrong k."""
    from ptxgen.codecs import q4_k as q4k

    orig = q4k.f16_words
    monkeypatch.setattr(q4k, "f16_words", lambda b, hdr, qs, *rest: orig(b, hdr, list(qs)[::-1], *rest))
    out = check_kernel("mmq_q4_k_wgmma_n32", _wgmma_mmq_ptx(), seed=0)
    assert not out.ok, out.detail


def test_writing_a_registers_before_their_wgmma_retires_is_an_error():
    """The hardware reads register A asynchronously: a write to one of them between the wgmma and the
    wait_group that retires it is a race (the register-A MMQ alternates two register sets for this)."""
    body = """
mov.b32 %r10, 0;
mov.b32 %r11, 0;
mov.b32 %r12, 0;
mov.b32 %r13, 0;
mov.u64 %rd6, 0x4000004000010000;
mov.f32 %f0, 0f00000000;
mov.f32 %f1, 0f00000000;
mov.f32 %f2, 0f00000000;
mov.f32 %f3, 0f00000000;
mul.lo.u32 %r3, %r31, 8;
add.u32 %r8, %r30, %r3;
st.shared.v2.u32 [%r8], {%r10, %r11};
bar.sync 0;
fence.proxy.async.shared::cta;
wgmma.fence.sync.aligned;
wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f0, %f1, %f2, %f3}, {%r10, %r11, %r12, %r13}, %rd6, 0, 1, 1, 0;
wgmma.commit_group.sync.aligned;
WRITE
wgmma.wait_group.sync.aligned 0;
"""
    run(body.replace("WRITE", "mov.b32 %r9, 1;"), 128, np.zeros(4096, np.uint8))  # another register: fine
    with pytest.raises(EmulationError, match="outlive"):
        run(body.replace("WRITE", "mov.b32 %r12, 1;"), 128, np.zeros(4096, np.uint8))


def test_wgmma_with_a_from_registers():
    """Register-sourced A (m64n8k16): warp w holds rows 16w..16w+15 in the mma.sync m16n8k16 A pattern —
    register j of lane l has (row g + 8·(j%2), cols 2·t + 8·(j/2) and +1), g = l/4, t = l%4."""
    rng = np.random.default_rng(5)
    A = rng.integers(-8, 8, (64, 16)).astype(np.float16)
    B = rng.integers(-8, 8, (8, 16)).astype(np.float16)
    frag = np.zeros((128, 4, 2), np.float16)
    for th in range(128):
        w, lane = divmod(th, 32)
        g, t = divmod(lane, 4)
        for j in range(4):
            for h in range(2):
                frag[th, j, h] = A[16 * w + g + 8 * (j % 2), 2 * t + 8 * (j // 2) + h]
    img = np.zeros(1024, np.uint8)  # B: 8 rows of 16 halves, K-major, 128B swizzle (32 of 128 bytes used)
    for r in range(8):
        for byte in range(32):
            img[_sw128(r, byte)] = B.view(np.uint8)[r, byte]
    out = np.concatenate([img, frag.view(np.uint8).reshape(-1), np.zeros(128 * 16, np.uint8)])
    body = """
mul.lo.u32 %r3, %r31, 8;
cvt.u64.u32 %rd1, %r3;
add.s64 %rd2, %rd15, %rd1;
ld.global.v2.u32 {%r4, %r5}, [%rd2];
add.u32 %r8, %r30, %r3;
st.shared.v2.u32 [%r8], {%r4, %r5};
mul.wide.u32 %rd3, %r31, 16;
add.s64 %rd4, %rd15, %rd3;
ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd4+1024];
bar.sync 0;
fence.proxy.async.shared::cta;
shr.u32 %r9, %r30, 4;
cvt.u64.u32 %rd5, %r9;
or.b64 %rd6, %rd5, 0x4000004000010000;
wgmma.fence.sync.aligned;
wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%f0, %f1, %f2, %f3}, {%r10, %r11, %r12, %r13}, %rd6, 0, 1, 1, 0;
wgmma.commit_group.sync.aligned;
wgmma.wait_group.sync.aligned 0;
st.global.v4.f32 [%rd4+3072], {%f0, %f1, %f2, %f3};
"""
    mem, o = run(body, 128, out)
    acc = mem.view(o, np.uint8, (out.size,))[3072:].view(np.float32).reshape(128, 4)
    D = np.zeros((64, 8), np.float32)
    for th in range(128):
        w, lane = divmod(th, 32)
        for i in range(4):
            D[16 * w + lane // 4 + 8 * (i // 2), 2 * (lane % 4) + i % 2] = acc[th, i]
    np.testing.assert_array_equal(D, A.astype(np.float32) @ B.astype(np.float32).T)


def test_warp_sync_and_griddepcontrol():
    """bar.warp.sync needs every named lane of the warp (a divergent one is an error); griddepcontrol is
    a no-op in the emulator (it runs grids one after another), and it must be accepted in both forms."""
    body = """
griddepcontrol.launch_dependents;
griddepcontrol.wait;
bar.warp.sync 0xFFFFFFFF;
mul.wide.u32 %rd2, %r31, 4;
add.s64 %rd3, %rd15, %rd2;
st.global.u32 [%rd3], %r31;
"""
    mem, o = run(body, 64, 64 * 4)
    np.testing.assert_array_equal(mem.view(o, np.uint32, (64,)), np.arange(64))
    with pytest.raises(EmulationError, match="divergent bar.warp.sync"):
        run("setp.lt.u32 %p1, %r31, 8;\n@%p1 bra $L_x;\nbar.warp.sync 0xFFFFFFFF;\n$L_x:", 32, 16)
    run("setp.lt.u32 %p1, %r31, 8;\n@%p1 bra $L_x;\nbar.warp.sync 0xFFFFFF00;\n$L_x:", 32, 16)  # lanes 8..31 only


def test_wgmma_mmq_split_k_fixup_over_the_consumer_warpgroups():
    """The wgmma MMQ split over 3 K ranges: each CTA stores its partial tile in fragment order, the last of a tile
    (its 256 consumer threads, named barrier 3) sums them in z order into y and resets the counter. The emulator
    runs CTAs one after another, so one CTA takes every item here; which CTA comes last varies only on the GPU
    (test_gpu_mmq.py::test_wgmma_split_k_fixup_is_correct_and_deterministic runs it bit for bit, run to run)."""
    out = check_kernel("mmq_q4_k_wgmma_n32", _wgmma_mmq_ptx(), seed=5, shape=(131, 40, 1024), splits=3)
    assert out.ok, out.detail


def test_interleaved_ctas_take_turns_in_a_seed_drawn_order():
    """Emulator.run(interleave=True): every CTA is resident and they take turns, so two CTAs' atomics on one
    counter meet in an order the seed draws (the sequential run gives CTA order); the counts stay exact."""
    body = """
mov.u32 %r1, %ctaid.x;
setp.eq.u32 %p1, %r31, 0;
mul.lo.u32 %r2, %r1, 40;
add.u32 %r3, %r2, 1;
$L_spin:
sub.u32 %r3, %r3, 1;
setp.ne.u32 %p2, %r3, 0;
@%p2 bra $L_spin;
@%p1 atom.global.add.u32 %r4, [%rd15], 1;
mul.wide.u32 %rd1, %r1, 4;
add.s64 %rd2, %rd15, %rd1;
@%p1 st.global.u32 [%rd2+4], %r4;
"""
    ptx = HEADER + "\tmov.u32 %r31, %tid.x;\n\tld.param.u64 %rd15, [out];\n\tmov.u32 %r30, sm;\n" + \
        "\n".join("\t" + line for line in body.strip().splitlines()) + "\n\tret;\n}\n"
    orders = set()
    for seed in [None] + list(range(12)):
        mem = Memory()
        o = mem.alloc(np.zeros(5, np.uint32))
        Emulator(ptx).run((4,), (32,), (o, bytes(128)), mem, seed=seed, interleave=seed is not None)
        got = mem.view(o, np.uint32, (5,))
        assert got[0] == 4 and sorted(got[1:].tolist()) == [0, 1, 2, 3]
        if seed is None:
            assert got[1:].tolist() == [0, 1, 2, 3]  # one after another: CTA order
        else:
            orders.add(tuple(got[1:].tolist()))
    assert len(orders) > 1, orders


def test_wgmma_mmq_split_k_fixup_with_ctas_taking_turns():
    """The wgmma MMQ's split-K fixup with 3 CTAs taking turns (Emulator interleave): items are claimed and a tile's
    3 splits arrive in seed-drawn orders, so the last CTA of a tile can be any split; y is
    correct, the counters reset, and the bits are the same for every order (the sum runs in z order)."""
    outs = [check_kernel("mmq_q4_k_wgmma_n32", _wgmma_mmq_ptx(), seed=5, shape=(131, 40, 1024), splits=3, ctas=3,
                         interleave=True, run_seed=s) for s in (5, 6, 7)]
    for out in outs:
        assert out.ok, out.detail
    for out in outs[1:]:
        np.testing.assert_array_equal(out.got, outs[0].got)


@pytest.mark.parametrize("name,shape,ctas", [("mmq_q4_k_wgmma_ra_n128_sk", (389, 137, 512), 5),
                                             ("mmq_q4_k_wgmma_ra_n128_sk", (128, 128, 1024), 3),
                                             pytest.param("mmq_q6_k_wgmma_ra_n256_sk", (261, 300, 2048), 7,
                                                          marks=pytest.mark.slow)])
def test_stream_k_register_a_mmq(name, shape, ctas):
    """The register-A MMQ's stream-K build (mmq.STREAM_NOTE): `ctas` CTAs each take ceil(U / ctas) K-steps of the
    tiles laid end to end (chunk boundaries mid-tile, mid-block for Q6_K's 4-step boxes; a tile cut into 2 or 3
    pieces: the two-split path and the z-order sum), taking turns in seed-drawn orders: correct, the counters and
    the queue back at zero (the harness checks), the same bits for every order."""
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    outs = [check_kernel(name, ptx, seed=5, shape=shape, ctas=ctas, interleave=True, run_seed=rs) for rs in (5, 6)]
    for out in outs:
        assert out.ok, out.detail
    np.testing.assert_array_equal(outs[1].got, outs[0].got)


@pytest.mark.parametrize("name,shape,splits", [
    ("mmq_q4_k_wgmma_ra_n128_cs", (131, 133, 1024), 4),
    ("mmq_q4_k_wgmma_ra_n128_cs", (100, 40, 512), 2),
    ("mmq_q4_k_wgmma_ra_n64_cs", (100, 40, 512), 2),
    pytest.param("mmq_q6_k_wgmma_ra_n64_cs", (131, 70, 2048), 4, marks=pytest.mark.slow),
    pytest.param("mmq_q4_k_wgmma_ra_n128_cs", (131, 133, 1024), 8, marks=pytest.mark.slow),
    pytest.param("mmq_q4_k_wgmma_ra_n256_cs", (131, 300, 1024), 2, marks=pytest.mark.slow),
    pytest.param("mmq_q6_k_wgmma_ra_n128_cs", (131, 133, 2048), 4, marks=pytest.mark.slow),
    pytest.param("mmq_q6_k_wgmma_ra_n256_cs", (131, 300, 2048), 2, marks=pytest.mark.slow)])
def test_cluster_split_mmq_sums_the_splits_through_distributed_shared_memory(name, shape, splits):
    """The register-A MMQ's cluster split-K build (mmq.CSPLIT_NOTE): one cluster of `splits` CTAs a tile, each its
    K range's partial into its own shared memory, rank z summing its share of every rank's partial
    (ld.shared::cluster) in z order: correct; the bits of the split build's fixup (partials in global memory, the
    last CTA's sums) on the same inputs; the same bits with the CTAs taking turns in seed-drawn orders, where a CTA
    that left before its peers read its partial is an emulator error (the second cluster barrier)."""
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    assert "ld.shared::cluster.v4.f32" in ptx and "atom" not in ptx.split("cluster split-K")[-1]
    plain = name.removesuffix("_cs")
    want = check_kernel(plain, KERNELS[plain].for_arch("sm_90a").ptx(), seed=5, shape=shape, splits=splits, ctas=8)
    assert want.ok, want.detail
    outs = [check_kernel(name, ptx, seed=5, shape=shape, splits=splits, interleave=rs is not None, run_seed=rs)
            for rs in (None, 5)]
    for out in outs:
        assert out.ok, out.detail
        np.testing.assert_array_equal(out.got, want.got)


@pytest.mark.parametrize("name", ["mmq_q4_k_wgmma_ra_n128_cs", pytest.param("mmq_q4_k_wgmma_ra_n256_cs",
                                                                           marks=pytest.mark.slow)])
def test_cluster_split_mmq_with_its_warpgroups_one_at_a_time(name):
    """The cluster split build with each CTA's warpgroups run one at a time between waits (a legal schedule: one
    consumer warpgroup ends its K loop while the other's last wgmmas still read the B stages the partial goes
    into): the split build's bits, as in lockstep. Without the consumers' barrier before the partial stores
    (the first build had none; a review found it) the first warpgroup's stores corrupt the other's last steps."""
    from ptxgen.emu.harness import EmulatorBackend, use_backend

    shape, splits = (100, 40, 512), 2
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    plain = name.removesuffix("_cs")
    want = check_kernel(plain, KERNELS[plain].for_arch("sm_90a").ptx(), seed=5, shape=shape, splits=splits, ctas=8)
    assert ptx.count("\tbar.sync 3, 256;\n") == 1  # (the consumers' one barrier: before the partial stores)
    racy = ptx.replace("\tbar.sync 3, 256;\n", "")
    with use_backend(EmulatorBackend(warp_serial=128)):
        out = check_kernel(name, ptx, seed=5, shape=shape, splits=splits)
        bad = check_kernel(name, racy, seed=5, shape=shape, splits=splits)
    assert want.ok and out.ok, (want.detail, out.detail)
    np.testing.assert_array_equal(out.got, want.got)
    assert not bad.ok or not np.array_equal(bad.got, want.got)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mmq_q4_k_wgmma_n32", "mmq_q4_k_wgmma_ra_n128"])
def test_wgmma_mmq_two_splits_second_cta_adds_into_its_accumulators(name):
    """Two K-splits take their own path: the first CTA of a tile stores its partial and raises the counter's ready
    bit, the second waits for it and adds that partial into its accumulators (it stores nothing). With CTAs
    taking turns the second can be either split, and the sum the same bits (a + b == b + a); sequentially too;
    the counters end at zero (the harness checks)."""
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    assert "red.release.gpu.global.add.u32" in ptx
    outs = [check_kernel(name, ptx, seed=5, shape=(131, 40, 1024), splits=2, ctas=3, interleave=rs is not None,
                         run_seed=rs) for rs in (None, 5, 6, 7)]
    for out in outs:
        assert out.ok, out.detail
    for out in outs[1:]:
        np.testing.assert_array_equal(out.got, outs[0].got)


@pytest.mark.slow
def test_register_a_mmq_converting_x_itself_matches_the_build_after_convert_f16_perm():
    """mmq_q4_k_wgmma_ra_n128_cx: warps 1-3 of the producer warpgroup convert fp32 x into the fp16 copy the TMA thread
    reads (chunk by chunk, x_ready counters acquired before each chunk's first TMA), no convert_f16_perm. With 3
    CTAs taking turns in seed-drawn orders (a CTA's TMA thread waits for chunks the others convert): the fp16 copy
    is convert_f16_perm's bit for bit, the x_ready counters end at zero (the harness checks both), and y has the
    bits of mmq_q4_k_wgmma_ra_n128 on pre-converted x — with one split and with two, and on 3 x 3 tiles with 3 CTAs,
    where the converters go one token tile at a time (G = ceil(CTAs / M-tiles) = 1: items run m fastest)."""
    cx = KERNELS["mmq_q4_k_wgmma_ra_n128_cx"].for_arch("sm_90a").ptx()
    assert "ld.acquire.gpu.global.u32" in cx and "fence.proxy.async.global" in cx and "convert_f16" not in cx
    ref = KERNELS["mmq_q4_k_wgmma_ra_n128"].for_arch("sm_90a").ptx()
    for shape, splits, seeds in (((131, 133, 512), 1, (7, 8)), ((131, 133, 512), 2, (7,)), ((259, 300, 512), 1, (9,))):
        want = check_kernel("mmq_q4_k_wgmma_ra_n128", ref, seed=7, shape=shape, splits=splits, ctas=3)
        assert want.ok, want.detail
        for rs in seeds:
            out = check_kernel("mmq_q4_k_wgmma_ra_n128_cx", cx, seed=7, shape=shape, splits=splits, ctas=3, run_seed=rs)
            assert out.ok, out.detail
            np.testing.assert_array_equal(out.got, want.got)


@pytest.mark.parametrize("fmt,bn", [("q8_0", 128), ("q5_K", 128), ("q8_0", 64)])
def test_codec_register_a_mmq_converting_x_itself_has_the_bits_of_the_build_after_convert_f16_perm(fmt, bn):
    """mmq_<fmt>_wgmma_ra_n<bn>_cx (the codecs of mmq.WGMMA_CX_CODECS; Q8_0's n64 with its deep ring beside the
    staging buffers): the producer warpgroup's warps 1-3 convert fp32 x as in Q4_K's converting build while the
    codec's boxes stream through the same stages: with 3 CTAs taking turns, one split and two, y has the bits of
    mmq_<fmt>_wgmma_ra_n<bn> on pre-converted x (the harness checks the fp16 copy against convert_f16_perm and the
    x_ready counters back at zero)."""
    f = fmt.lower()
    cx = KERNELS[f"mmq_{f}_wgmma_ra_n{bn}_cx"].for_arch("sm_90a").ptx()
    assert "ld.acquire.gpu.global.u32" in cx and "fence.proxy.async.global" in cx
    ref = KERNELS[f"mmq_{f}_wgmma_ra_n{bn}"].for_arch("sm_90a").ptx()
    for shape, splits in (((131, bn + 5, 512), 1), ((131, 70, 512), 2)):
        want = check_kernel(f"mmq_{f}_wgmma_ra_n{bn}", ref, seed=5, shape=shape, splits=splits, ctas=3)
        assert want.ok, want.detail
        out = check_kernel(f"mmq_{f}_wgmma_ra_n{bn}_cx", cx, seed=5, shape=shape, splits=splits, ctas=3, run_seed=6)
        assert out.ok, out.detail
        np.testing.assert_array_equal(out.got, want.got)


@pytest.mark.parametrize("bn,cs", [(64, False), pytest.param(64, True, marks=pytest.mark.slow),
                                   pytest.param(128, False, marks=pytest.mark.slow),
                                   pytest.param(256, False, marks=pytest.mark.slow),
                                   pytest.param(256, True, marks=pytest.mark.slow)])
def test_q6_k_register_a_mmq_on_row_groups_has_the_bits_of_the_row_build(bn, cs):
    """mmq_q6_k_wgmma_ra_n<bn>_g8(_cs) (kernels/mmq.py ROW_GROUP_NOTE: the weights as groups of 8 rows, a tile's box
    by 8 TMA loads, each consumer warp's rows at their own phase in the 16 bytes, y rows permuted back): on K a
    multiple of 2048 (rows 16-byte whole, where the row build runs too) y has the row build's bits, M = 136 (a
    partial second tile); on K = 768 and 1280 (rows of 630 and 1050 bytes, the row build's map impossible) within the
    fp16 GEMMs' bound of float64 (the harness's check), one K split and two."""
    sfx = "_cs" if cs else ""
    g8 = KERNELS[f"mmq_q6_k_wgmma_ra_n{bn}_g8{sfx}"].for_arch("sm_90a").ptx()
    assert g8.count("cp.async.bulk.tensor.2d") >= 9  # (8 boxes a block, and x's)
    ref = KERNELS[f"mmq_q6_k_wgmma_ra_n{bn}{sfx}"].for_arch("sm_90a").ptx()
    want = check_kernel(f"mmq_q6_k_wgmma_ra_n{bn}{sfx}", ref, seed=5, shape=(136, bn + 5, 2048), ctas=3)
    assert want.ok, want.detail
    out = check_kernel(f"mmq_q6_k_wgmma_ra_n{bn}_g8{sfx}", g8, seed=5, shape=(136, bn + 5, 2048), ctas=3)
    assert out.ok, out.detail
    np.testing.assert_array_equal(out.got, want.got)
    for shape, splits in (((136, bn + 5, 768), 1), ((264, 70, 1280), 2)):
        out = check_kernel(f"mmq_q6_k_wgmma_ra_n{bn}_g8{sfx}", g8, seed=6, shape=shape, splits=splits, ctas=3)
        assert out.ok, out.detail


@pytest.mark.slow
@pytest.mark.parametrize("bn", [32, 64, 128])
def test_q6_k_grouped_mmq_on_row_groups_has_the_bits_of_the_row_build(bn):
    """mmq_q6_k_wgmma_ra_n<bn>_g8_moe (mul_mat_id's grouped build on 8-row groups, rule moe_row_groups): the expert's
    weight row e·M + m0 a whole group where M is; on K = 2048 y has the row build's bits (3 experts of 136 rows, the
    harness's ids: repeats, an empty expert, a bad id), on K = 768 (rows of 630 bytes) the harness's float64 bound."""
    g8 = KERNELS[f"mmq_q6_k_wgmma_ra_n{bn}_g8_moe"].for_arch("sm_90a").ptx()
    ref = KERNELS[f"mmq_q6_k_wgmma_ra_n{bn}_moe"].for_arch("sm_90a").ptx()
    want = check_kernel(f"mmq_q6_k_wgmma_ra_n{bn}_moe", ref, seed=4, shape=(3, 136, 2048))
    assert want.ok, want.detail
    out = check_kernel(f"mmq_q6_k_wgmma_ra_n{bn}_g8_moe", g8, seed=4, shape=(3, 136, 2048))
    assert out.ok, out.detail
    np.testing.assert_array_equal(out.got, want.got)
    out = check_kernel(f"mmq_q6_k_wgmma_ra_n{bn}_g8_moe", g8, seed=5)
    assert out.ok, out.detail


@pytest.mark.parametrize("fmt", ["q8_0", "q5_K", "q6_K", "tq4_1s"])
def test_codec_register_a_mmq_has_the_bits_of_the_prepared_gemm_on_its_fragments(fmt, monkeypatch):
    """mmq_<fmt>_wgmma_ra_n*: the codec's blocks decoded in the K loop — Q8_0 by codecs.q8_0.ra_fragments (TMA boxes
    from 16-byte aligned starts, the step's blocks 4·(s & 3) bytes in, quants by prmt against 0x64, fp16(q·d)); Q5_K
    by Q4_K's nibble decode with each weight's fifth bit from the qh columns. The prepared GEMM
    mmq_q4_k_wgmma_pre_n256 on dequantize_<fmt>_frags' fragments (bit-checked against NumPy) multiplies the same A
    values in the same wgmma order for Q8_0 (one rounding of q·d both ways): y has the same bits; Q5_K's decode
    rounds twice in fp16 (q4_k.dequant_pair3, as Q4_K's register-A GEMM), Q6_K's too (codecs.q6_k.ra_fragments: d·sc
    to fp16, then the product; its 210-byte blocks from 240-byte boxes at every 2-byte offset), and TQ4_1S's
    (codecs.tq4_1s.ra_fragments: fp16 codebook magnitudes by prmt, times ±d in fp16; both GEMMs on the rotated x), so
    y is within 1e-3 of the prepared GEMM's — one split and two, K-steps at every offset, M and T past a tile; n64 within 1e-3 of float64 with three
    CTAs taking turns. (The builds in layouts.q4k_rega_k_order, the prepared fragments' order: the shipped ones read x
    in its natural order, mmq.RA_NATURAL_FORMATS, checked by test_register_a_builds_take_x_in_its_natural_k_order.)"""
    from ptxgen.emu.harness import mmq_wgmma_case
    from ptxgen.kernels import mmq

    monkeypatch.setattr(mmq, "RA_NATURAL_FORMATS", ())

    f = fmt.lower()
    pre = KERNELS["mmq_q4_k_wgmma_pre_n256"].for_arch("sm_90a")
    ra = KERNELS[f"mmq_{f}_wgmma_ra_n256"].for_arch("sm_90a").ptx()
    kq = 4 if fmt == "q6_K" else 1  # Q6_K's rows are 16-byte multiples (the tensor map's stride) from K = 2048
    cases = (((131, 20, 512), 1), ((259, 9, 1024), 2)) if kq == 1 else (((131, 9, 2048), 2),)  # all 8 offsets
    for shape, splits in cases:
        got = check_kernel(f"mmq_{f}_wgmma_ra_n256", ra, seed=11, shape=shape, splits=splits, ctas=3)
        assert got.ok, got.detail
        want = mmq_wgmma_case(pre.ptx(), dict(pre.meta, name="pre", fmt=fmt), np.random.default_rng(11),
                              shape=shape, splits=splits, ctas=3, seed=11)
        assert want.ok, want.detail
        if fmt == "q8_0":
            np.testing.assert_array_equal(got.got, want.got)
        else:
            assert np.linalg.norm(got.got - want.got) <= 1e-3 * np.linalg.norm(want.got)
    if kq == 1:  # (Q6_K's n64 at K = 2048 is test_emu's fast case)
        out = check_kernel(f"mmq_{f}_wgmma_ra_n64", KERNELS[f"mmq_{f}_wgmma_ra_n64"].for_arch("sm_90a").ptx(), seed=12,
                           shape=(200, 70, 768), ctas=3, interleave=True)
        assert out.ok, out.detail


@pytest.mark.parametrize("name", ["mmq_q4_k_wgmma_ra_n64", "mmq_q5_k_wgmma_ra_n64", "mmq_q4_k_wgmma_ra_n64_cx",
                                  "mmq_q6_k_wgmma_ra_n64", "mmq_q8_0_wgmma_ra_n64", "mmq_q8_0_wgmma_ra_n64_cx"])
def test_register_a_builds_take_x_in_its_natural_k_order(name, monkeypatch):
    """mmq.RA_NATURAL_FORMATS (shipped: every codec but TQ4_1S): the dense register-A builds' lanes load their weights
    in x's own K order (two 2-byte loads and a prmt a word), so x needs no permute (meta x_order "natural"; the
    converting build's converters write x16 in that order): right against float64 with natural x, as the build in
    layouts.q4k_rega_k_order is with permuted x (the harness feeds each the order its meta names)."""
    from ptxgen.kernels import mmq

    for order in ("natural", "rega"):  # (the harness reads the build's meta under the same setting)
        if order == "rega":
            monkeypatch.setattr(mmq, "RA_NATURAL_FORMATS", ())
        k = KERNELS[name].for_arch("sm_90a")
        ptx = k.ptx()
        assert k.meta["x_order"] == order and ("ld.shared.u16" in ptx) == (order == "natural")
        out = check_kernel(name, ptx, seed=4, shape=(131, 20, 2048), ctas=3)  # (Q6_K rows: K = 2048)
        assert out.ok, out.detail


def _same_bits(name, ptxs, seed, **kw):
    """Two builds of one kernel (a build flag's two settings) on the emulator: both right, and y bit for bit."""
    outs = [check_kernel(name, ptx, seed=seed, **kw) for ptx in ptxs]
    assert all(o.ok for o in outs), [o.detail for o in outs]
    np.testing.assert_array_equal(np.asarray(outs[0].got).view(np.uint32), np.asarray(outs[1].got).view(np.uint32))


@pytest.mark.parametrize("name,kw", [
    ("mmq_q6_k_wgmma_ra_n64", dict(shape=(131, 20, 2048), splits=2, ctas=3)),
    pytest.param("mmq_q6_k_wgmma_ra_n256", dict(shape=(131, 9, 2048), ctas=2), marks=pytest.mark.slow),
    pytest.param("mmq_q6_k_wgmma_ra_n64_moe", dict(), marks=pytest.mark.slow)])
def test_q6k_register_a_scales_in_fp16_give_the_float32_forms_bits(name, kw, monkeypatch):
    """codecs.q6_k.RA_HALF_SCALES (shipped): a step's two d·sc of a row as one HMUL2 of (sc0, sc1) — built from the
    int8 bytes by a pack, a lop3 and an HSUB2 — and (d, d): the exact product rounded once to fp16, as the float32
    form's cvt.rn.f16.f32(d·sc): y bit for bit (dense with splits, the n256 tile, the grouped build), with no I2F /
    F2F left in the decode."""
    from ptxgen.codecs import q6_k

    half = KERNELS[name].for_arch("sm_90a").ptx()
    monkeypatch.setattr(q6_k, "RA_HALF_SCALES", False)
    f32 = KERNELS[name].for_arch("sm_90a").ptx()
    assert "ld.shared.s8" in f32 and "ld.shared.s8" not in half
    _same_bits(name, (half, f32), seed=7, **kw)


@pytest.mark.parametrize("name,kw", [
    ("mmq_q4_k_wgmma_ra_n128", dict(shape=(131, 40, 1792), splits=3, ctas=3)),  # splits from mid-block steps
    ("mmq_q5_k_wgmma_ra_n64", dict(shape=(70, 20, 1280), splits=3, ctas=2)),
    ("mmq_q4_k_wgmma_ra_n64_moe", dict())])
def test_register_a_scales_decoded_once_a_block_give_the_per_step_decodes_bits(name, kw, monkeypatch):
    """codecs.q4_k.RegA decodes a lane's scales once a super-block (at its first step, or the item's when a split
    starts mid-block) and picks each step's from registers; the per-step decode (RA_BLOCK_SCALES off) forms the
    same fp16 values (−dmin·m's hi / lo by fp16 mul and fma round the exact product once, as the fp32 forms): y
    bit for bit, dense with three splits and grouped."""
    from ptxgen.codecs import q4_k

    monkeypatch.setattr(q4_k, "RA_STATIC_STEPS", False)  # the grouped build's run-time test (static: test_moe's)
    block = KERNELS[name].for_arch("sm_90a").ptx()
    monkeypatch.setattr(q4_k, "RA_BLOCK_SCALES", False)
    step = KERNELS[name].for_arch("sm_90a").ptx()
    assert "ra_block_kept" in block and "ra_block_kept" not in step
    _same_bits(name, (block, step), seed=9, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("value,flagged", [(7e4, True), (-np.inf, True), (6e4, False)])
def test_register_a_mmq_converting_x_itself_flags_fp16_overflow(value, flagged):
    """The converters raise the overflow flag exactly when a value of x is not finite in fp16 (|x| ≥ 65520 rounds
    to inf; 6e4 does not), as convert_f16 does, so mul_mat recomputes those calls exactly."""
    cx = KERNELS["mmq_q4_k_wgmma_ra_n128_cx"].for_arch("sm_90a").ptx()
    out = check_kernel("mmq_q4_k_wgmma_ra_n128_cx", cx, seed=3, shape=(131, 133, 512), ctas=2,
                       poison_x=(132, 301, np.float32(value)))
    assert out.ok, out.detail
    assert ("overflow flagged" in out.detail) == flagged


@pytest.mark.slow
def test_register_a_mmq_converting_x_itself_flags_a_token_too_small_for_fp16():
    """The converters raise the same flag for a token whose row lies under fp16's precision (scaled by 1e-6:
    convert_f16.too_small), as convert_f16 does, so the fixup behind the GEMM recomputes it exactly."""
    cx = KERNELS["mmq_q4_k_wgmma_ra_n128_cx"].for_arch("sm_90a").ptx()
    out = check_kernel("mmq_q4_k_wgmma_ra_n128_cx", cx, seed=3, shape=(131, 133, 512), ctas=2, tiny_token=100)
    assert out.ok, out.detail
    assert "overflow flagged" in out.detail


def run_cluster(body: str, grid: int, threads: int, out, cluster=2, tmap=bytes(128), seed=0):
    """`body` on `grid` CTAs in clusters of `cluster` (the emulator interleaves them); %r31 tid, %rd15 out, %r30 sm."""
    ptx = HEADER.replace("%rd<16>;", "%rd<16>;\n\t.reg .b16 %rs<4>;") + \
        "\tmov.u32 %r31, %tid.x;\n\tld.param.u64 %rd15, [out];\n\tmov.u32 %r30, sm;\n" + \
        "\n".join("\t" + line for line in body.strip().splitlines()) + "\n\tret;\n}\n"
    mem = Memory()
    o = mem.alloc(out)
    Emulator(ptx).run((grid,), (threads,), (o, tmap if not callable(tmap) else tmap(mem)), mem, seed=seed,
                      cluster=(cluster, 1, 1))
    return mem, o


CLUSTER_PING = """
mov.u32 %r1, %cluster_ctarank;
mov.u32 %r2, %cluster_nctarank;
mov.u32 %r3, %clusterid.x;
setp.eq.u32 %p1, %r31, 0;
@%p1 mbarrier.init.shared::cta.b64 [%r30], 32;
fence.mbarrier_init.release.cluster;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
xor.b32 %r4, %r1, 1;
mapa.shared::cluster.u32 %r5, %r30, %r4;
mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r5];
$L_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r30], 0;
@!%p2 bra $L_wait;
mad.lo.u32 %r6, %r1, 100, %r3;
mad.lo.u32 %r6, %r2, 10, %r6;
mov.u32 %r7, %ctaid.x;
mul.wide.u32 %rd1, %r7, 4;
add.s64 %rd2, %rd15, %rd1;
@%p1 st.global.u32 [%rd2], %r6;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cluster_ranks_mapa_remote_arrivals_and_the_cluster_barrier(seed):
    """Clusters of 2 CTAs (interleaved in seed-drawn turns): %cluster_ctarank / %cluster_nctarank / %clusterid;
    each CTA inits an mbarrier for 32 arrivals, the cluster barrier makes that visible, every thread arrives on
    its peer's barrier through mapa, then waits for its own; a final cluster barrier keeps both alive meanwhile."""
    mem, o = run_cluster(CLUSTER_PING, 4, 32, np.zeros(4, np.uint32), seed=seed)
    np.testing.assert_array_equal(mem.view(o, np.uint32, (4,)), [20, 120, 21, 121])


def test_cluster_errors_deadlock_and_an_exited_peer():
    """Waiting for arrivals that never come (nobody arrives on the peer's barrier) is a deadlock of the whole
    cluster; arriving on the barrier of a peer that has exited (no final cluster barrier, the peer leaves at
    once) is an error."""
    with pytest.raises(EmulationError, match="deadlock"):
        run_cluster(CLUSTER_PING.replace("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r5];", ""),
                    2, 32, np.zeros(2, np.uint32))
    early_exit = """
mov.u32 %r1, %cluster_ctarank;
setp.eq.u32 %p1, %r31, 0;
@%p1 mbarrier.init.shared::cta.b64 [%r30], 32;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
setp.eq.u32 %p3, %r1, 1;
@%p3 ret;
mov.u32 %r8, 3000;
$L_spin:
sub.u32 %r8, %r8, 1;
setp.ne.u32 %p4, %r8, 0;
@%p4 bra $L_spin;
mapa.shared::cluster.u32 %r5, %r30, 1;
mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r5];
"""
    with pytest.raises(EmulationError, match="exited"):
        run_cluster(early_exit, 2, 32, np.zeros(2, np.uint32))


def test_tma_multicast_lands_in_every_cta_of_the_mask():
    """cp.async.bulk.tensor ... .multicast::cluster from rank 0 with ctaMask 0b11: the same box lands at the same
    offset in both CTAs of the cluster, each completing the transaction on its own mbarrier; rank 1 only waits."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((5, 80)).astype(np.float16)
    body = """
mov.u32 %r10, %cluster_ctarank;
setp.eq.u32 %p1, %r31, 0;
add.u32 %r1, %r30, 16384;
@%p1 mbarrier.init.shared::cta.b64 [%r1], 1;
@%p1 mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r1], 1024;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
mov.b64 %rd1, tmap;
cvta.param.u64 %rd2, %rd1;
mov.u32 %r2, 32;
mov.u32 %r3, 1;
mov.u16 %rs1, 3;
setp.eq.u32 %p5, %r10, 0;
and.pred %p5, %p5, %p1;
@%p5 cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%r30], [%rd2, {%r2, %r3}], [%r1], %rs1;
$L_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r1], 0;
@!%p3 bra $L_wait;
mul.lo.u32 %r4, %r31, 16;
add.u32 %r5, %r30, %r4;
ld.shared.v4.u32 {%r6, %r7, %r8, %r9}, [%r5];
mad.lo.u32 %r11, %r10, 1024, %r4;
mul.wide.u32 %rd4, %r11, 1;
add.s64 %rd5, %rd15, %rd4;
st.global.v4.u32 [%rd5+4096], {%r6, %r7, %r8, %r9};
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
"""
    out = np.concatenate([g.view(np.uint8).reshape(-1), np.zeros(4096 - g.nbytes + 2048, np.uint8)])

    def tmap(mem):
        return tensor_map_2d(mem.bases[0], "f16", 5, 80, 8, 64, "128B")

    mem, o = run_cluster(body, 2, 64, out, tmap=tmap, seed=3)
    boxes = mem.view(o, np.uint8, (4096 + 2048,))[4096:].reshape(2, 1024)
    assert boxes[0].any()
    np.testing.assert_array_equal(boxes[1], boxes[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mmq_q4_k_wgmma_ra_n128_mc2", "mmq_q4_k_wgmma_ra_n256_mc2"])
def test_wgmma_mmq_in_clusters_of_two_multicasts_the_activation_tile(name):
    """The register-A MMQ in clusters of 2 (each rank loads half of a step's activation tile and multicasts it to
    both; a ring stage is free once both CTAs' consumers released it, through remote mbarrier arrivals): 3 M-tiles
    (the second cluster's rank 1 lies past M and only takes part in the ring), 2 token tiles, 2 K-splits, 2
    clusters taking seed-drawn turns: within 1e-3 of the float64 reference, the same bits for two orders."""
    ptx = KERNELS[name].for_arch("sm_90a").ptx()
    outs = [check_kernel(name, ptx, seed=3, shape=(259, 150, 1024), splits=2, ctas=4, run_seed=rs) for rs in (1, 2)]
    for out in outs:
        assert out.ok, out.detail
    np.testing.assert_array_equal(outs[0].got, outs[1].got)


def test_wgmma_mmq_cluster_without_remote_releases_deadlocks():
    """Without the consumers' arrivals on the peer's empty barriers (which count both CTAs' consumers) no
    producer may refill a stage: the emulator reports the cluster-wide deadlock instead of letting a multicast
    overwrite a tile the peer still reads."""
    ptx = KERNELS["mmq_q4_k_wgmma_ra_n128_mc2"].for_arch("sm_90a").ptx()
    bad = re.sub(r"\t(@%p\d+ )?mbarrier\.arrive\.shared::cluster\.b64 _, \[%r\d+\];\n", "", ptx)
    assert bad != ptx
    with pytest.raises(EmulationError, match="deadlock"):
        check_kernel("mmq_q4_k_wgmma_ra_n128_mc2", bad, seed=3, shape=(259, 150, 512), splits=1, ctas=2)
