"""Faults injected at each point of vk.py (a submit, a fence wait, a copy, an allocation):
the call raises a DeviceFault, the device is left idle with its fences reset, and the next
submit computes what numpy computes. A lost device refuses every later call cleanly."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from vulkan import lib

from engine.gpu import vk
from engine.gpu.graph import Graph

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[3]

N_OUT, N_IN, N_TOK = 256, 2048, 48      # tens of milliseconds on lavapipe: still running
                                        # when an injected timeout is reported


@pytest.fixture(autouse=True)
def _disarm():
    vk.clear_faults()
    yield
    vk.clear_faults()


def nmse(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - want) ** 2) / np.sum(want ** 2))


class Product:
    """y = x @ w.T recorded once as a graph (mul_mat, f32 weights), with its numpy answer."""

    def __init__(self, dev, kc, seed: int):
        rng = np.random.default_rng(seed)
        self.dev = dev
        self.w = rng.standard_normal((N_OUT, N_IN)).astype(np.float32)
        self.x = rng.standard_normal((N_TOK, N_IN)).astype(np.float32)
        a = dev.allocator
        self.bw = a.alloc(self.w.nbytes, "w", "weights")
        self.bx = a.alloc(self.x.nbytes, "x", "compute")
        self.by = a.alloc(4 * N_TOK * N_OUT, "y", "compute")
        vk.upload(dev, self.bw, self.w)
        vk.upload(dev, self.bx, self.x)
        self.g = Graph(dev, kc, f"product{seed}")
        self.g.op("mul_mat", [self.bw, self.bx, self.by], (N_OUT // 4, -(-N_TOK // 8), 1),
                  wtype="F32", spec=dict(WG=dev.subgroup_size * 2, ROWS=2, NT=8, ACC=0),
                  n_in=N_IN, n_out=N_OUT, n_tokens=N_TOK, x_offset=0, y_offset=0,
                  row_offset=0, y_stride=N_OUT)
        self.g.finish()

    def run_and_check(self) -> None:
        vk.upload(self.dev, self.by, np.full(N_TOK * N_OUT, np.nan, np.float32))
        self.g.replay()
        got = vk.download(self.dev, self.by).view(np.float32).reshape(N_TOK, N_OUT)
        assert nmse(got, self.x @ self.w.T) < 1e-10

    def close(self) -> None:
        self.g.close()
        for b in (self.bw, self.bx, self.by):
            self.dev.allocator.free(b)


@pytest.fixture
def products(dev, kc):
    ps = [Product(dev, kc, 1), Product(dev, kc, 2)]
    yield ps
    for p in ps:
        p.close()


def fence_unsignalled(dev) -> bool:
    # VkResult vkGetFenceStatus(VkDevice, VkFence): VK_NOT_READY while unsignalled
    return lib.vkGetFenceStatus(dev.device, dev.fence) == 1


@pytest.mark.parametrize("point,kind", [("submit", "timeout"), ("submit", "out_of_memory"),
                                        ("wait", "timeout"), ("wait", "out_of_memory")])
def test_a_failed_submit_leaves_the_device_clean(dev, products, point, kind):
    a, b = products
    a.run_and_check()
    faults = dev.faults
    f = vk.inject(point, kind, nth=2)
    a.g.replay()                                   # the 1st call at the point: no fault
    with pytest.raises(vk.DeviceFault) as err:
        b.g.replay()                               # the 2nd: fails
    assert f.fired
    assert (err.value.kind, err.value.where) == (kind, point)
    assert err.value.result == vk.FAULT_RESULTS[kind]
    assert dev.faults == faults + 1 and dev.last_fault is err.value and not dev.lost
    assert fence_unsignalled(dev)
    # the next submits wait for their own work: another graph, then the failed one again
    a.run_and_check()
    b.run_and_check()
    a.run_and_check()


def test_a_timeout_is_reported_while_the_work_runs_and_waited_for_before_raising(dev, products):
    a, b = products
    vk.upload(dev, a.by, np.full(N_TOK * N_OUT, np.nan, np.float32))
    vk.inject("wait", "timeout")
    with pytest.raises(vk.DeviceFault, match="timeout"):
        a.g.replay()
    # the failed work ran to its end before the raise (the queue went idle): nothing of it
    # is left to land on the device after the next submit
    got = vk.download(dev, a.by).view(np.float32).reshape(N_TOK, N_OUT)
    assert nmse(got, a.x @ a.w.T) < 1e-10
    b.run_and_check()


def test_a_slow_fence_is_waited_for_past_the_wait_slice(dev, products, monkeypatch):
    a, _ = products
    monkeypatch.setattr(vk, "WAIT_SLICE_NS", 1000)          # 1 us: every wait times out
    faults = dev.faults
    for _ in range(3):
        a.run_and_check()
    assert dev.faults == faults


def test_a_fence_limit_turns_a_slow_wait_into_a_timeout_fault(dev, products, monkeypatch):
    a, b = products
    monkeypatch.setattr(vk, "WAIT_SLICE_NS", 1000)
    monkeypatch.setattr(dev, "fence_limit_s", 1e-6)
    with pytest.raises(vk.DeviceFault) as err:
        a.g.replay()
    assert (err.value.kind, err.value.where) == ("timeout", "wait")
    monkeypatch.setattr(dev, "fence_limit_s", None)
    b.run_and_check()
    a.run_and_check()


@pytest.mark.parametrize("kind", ["timeout", "out_of_memory"])
def test_a_failed_one_shot_copy_leaves_the_device_clean(dev, products, kind):
    a, _ = products
    rng = np.random.default_rng(3)
    src_np = rng.standard_normal(1 << 16).astype(np.float32)
    src = dev.allocator.alloc(src_np.nbytes, "src", "staging", host=True)
    dst = dev.allocator.alloc(src_np.nbytes, "dst", "staging", host=True)
    try:
        src.write(src_np)
        dst.write(np.zeros_like(src_np))
        vk.inject("copy", kind)
        with pytest.raises(vk.DeviceFault) as err:
            with dev.one_shot() as cmd:
                vk.copy_buffer(cmd, src, 0, dst, 0, src_np.nbytes)
        assert (err.value.kind, err.value.where) == (kind, "copy")
        assert fence_unsignalled(dev)
        a.run_and_check()
        dst.write(np.zeros_like(src_np))
        with dev.one_shot() as cmd:
            vk.copy_buffer(cmd, src, 0, dst, 0, src_np.nbytes)
        assert np.array_equal(dst.read(np.float32), src_np)
    finally:
        dev.allocator.free(src)
        dev.allocator.free(dst)


@pytest.mark.parametrize("point,kind,nth", [("copy", "out_of_memory", 2), ("copy", "timeout", 3),
                                            ("wait", "timeout", 1)])
def test_a_failed_copy_stream_leaves_the_device_clean(dev, products, point, kind, nth):
    """A restore's copy batches: a refused or timed-out batch, or a failed wait for them,
    raises DeviceFault with the queue idle and every fence and command buffer given back;
    copies afterwards work."""
    a, _ = products
    data = np.random.default_rng(6).standard_normal(1 << 16).astype(np.float32)
    src = dev.allocator.alloc(data.nbytes, "src", "staging", host=True)
    dst = dev.allocator.alloc(data.nbytes, "dst", "weights")
    try:
        src.write(data)
        vk.inject(point, kind, nth=nth)
        stream = vk.CopyStream(dev)
        with pytest.raises(vk.DeviceFault) as err:
            for i in range(4):
                q = data.nbytes // 4
                stream.copy(src, dst, [(i * q, i * q, q)])
                stream.submit()
            stream.wait()
        assert err.value.kind == kind
        stream.close()
        assert not stream._inflight and fence_unsignalled(dev)
        a.run_and_check()
        again = vk.CopyStream(dev)
        again.copy(src, dst, [(0, 0, data.nbytes)])
        again.wait()
        assert np.array_equal(vk.download(dev, dst).view(np.float32), data)
    finally:
        dev.allocator.free(src)
        dev.allocator.free(dst)


@pytest.mark.parametrize("point,kind,nth", [("copy", "timeout", 2), ("copy", "out_of_memory", 3),
                                            ("wait", "timeout", 1), ("wait", "out_of_memory", 2)])
def test_a_failed_staged_upload_leaves_the_device_clean(dev, products, point, kind, nth):
    a, _ = products
    data = np.random.default_rng(4).standard_normal(1 << 16).astype(np.float32)   # 256 KiB
    dst = dev.allocator.alloc(data.nbytes, "dst", "compute")
    try:
        vk.inject(point, kind, nth=nth)
        # through 64 KiB staging buffers: several submits and waits, one of which fails
        with pytest.raises(vk.DeviceFault) as err:
            with vk.Uploader(dev, staging_bytes=64 << 10, direct=False) as up:
                up.write(dst, data)
        assert err.value.kind == kind
        assert fence_unsignalled(dev)
        with vk.Uploader(dev, staging_bytes=64 << 10, direct=False) as up:
            up.write(dst, data)
        assert np.array_equal(vk.download(dev, dst).view(np.float32), data)
        a.run_and_check()
    finally:
        dev.allocator.free(dst)


def test_an_allocation_out_of_memory_is_no_fault_and_the_next_one_works(dev, products):
    a, _ = products
    faults = dev.faults
    vk.inject("alloc", "out_of_memory")
    before = dev.allocator.totals()
    with pytest.raises(vk.OutOfMemory, match="injected"):
        dev.allocator.alloc(1 << 20, "big", "compute")
    assert dev.allocator.totals() == before and dev.faults == faults
    b = dev.allocator.alloc(1 << 20, "big", "compute")
    dev.allocator.free(b)
    a.run_and_check()


@pytest.mark.parametrize("point", ["submit", "wait", "copy", "alloc"])
def test_a_lost_device_refuses_every_later_call(point):
    from engine.gpu.kernels import KernelCache

    dev = vk.Device()
    kc = KernelCache(dev)
    try:
        p = Product(dev, kc, 5)
        p.run_and_check()
        vk.inject(point, "device_lost")
        with pytest.raises(vk.DeviceLost) as err:
            if point == "alloc":
                dev.allocator.alloc(64, "x", "compute")
            elif point == "copy":
                with dev.one_shot() as cmd:
                    vk.copy_buffer(cmd, p.bx, 0, p.by, 0, 64)
            else:
                p.g.replay()
        assert err.value.kind == "device_lost" and err.value.where == point
        assert dev.lost and dev.faults == 1
        for call in (p.g.replay, lambda: dev.allocator.alloc(64, "x", "compute"),
                     lambda: vk.download(dev, p.by), lambda: vk.upload(dev, p.by, p.x[:1]),
                     lambda: kc.get("add")):
            with pytest.raises(vk.DeviceLost, match="was lost .* until hotseat is restarted"):
                call()
        p.close()                                  # freeing still works
    finally:
        kc.close()
        dev.close()
    assert dev.device is None


def test_fault_specs():
    fs = vk.parse_faults("submit:timeout:3, wait:device_lost ,alloc:out_of_memory:2")
    assert [(f.point, f.kind, f.nth) for f in fs] == [("submit", "timeout", 3),
                                                     ("wait", "device_lost", 1),
                                                     ("alloc", "out_of_memory", 2)]
    assert vk.parse_faults("") == []
    for bad in ("submit", "submit:timeout:x", "launch:timeout", "submit:crash",
                "alloc:timeout", "wait:timeout:0"):
        with pytest.raises(ValueError):
            vk.parse_faults(bad)


def test_the_environment_variable_arms_faults_in_a_new_process():
    script = textwrap.dedent("""
        import numpy as np
        from engine.gpu import vk
        from engine.gpu.graph import run_once
        from engine.gpu.kernels import KernelCache

        dev = vk.Device()
        kc = KernelCache(dev)
        rng = np.random.default_rng(0)
        for i in range(3):
            a, b = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
            bufs = [dev.allocator.alloc(1200, f"t{j}", "compute") for j in range(3)]
            vk.upload(dev, bufs[0], a)
            vk.upload(dev, bufs[1], b)
            try:
                run_once(dev, kc, "add", bufs, (5, 1, 1), n=300, b_len=300, scale=1.0)
            except vk.DeviceFault as exc:
                print(i, "fault", exc.kind, exc.where, dev.faults)
                continue
            ok = np.array_equal(vk.download(dev, bufs[2]).view(np.float32), a + b)
            print(i, "ok" if ok else "wrong", dev.faults)
        kc.close()
        dev.close()
    """)
    env = {**os.environ, "HOTSEAT_FAULT": "submit:timeout:2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["0 ok 0", "1 fault timeout submit 1", "2 ok 1"]
