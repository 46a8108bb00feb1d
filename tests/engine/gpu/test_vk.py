"""Device choice, the sub-allocator and transfers."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gpu import vk

pytestmark = pytest.mark.gpu


def info(i, name, kind):
    return vk.DeviceInfo(i, name, kind, 0, "1.3")


def test_choose_device_prefers_discrete_and_honours_override():
    devs = [info(0, "llvmpipe", "cpu"), info(1, "Radeon RX 580", "discrete"),
            info(2, "Intel UHD", "integrated")]
    assert vk.choose_device(devs, None).index == 1
    assert vk.choose_device(devs, "llvm").index == 0
    assert vk.choose_device(devs, "2").index == 2
    with pytest.raises(vk.VulkanError, match="matches no Vulkan device"):
        vk.choose_device(devs, "geforce")
    with pytest.raises(vk.VulkanError, match="no Vulkan device"):
        vk.choose_device([], None)


@pytest.mark.parametrize("name", ["HOTSEAT_FENCE_LIMIT_S", "HOTSEAT_WAIT_MIN_S"])
def test_a_device_refuses_seconds_that_are_not(monkeypatch, name):
    monkeypatch.setenv(name, "0.25")
    assert vk.seconds_setting(name) == 0.25
    monkeypatch.delenv(name)
    assert vk.seconds_setting(name) == 0.0
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=f"{name}: '{bad}' is not a number of seconds"):
            vk.Device()


def test_the_workgroup_scope_matrices_are_asked_for_with_the_features_they_need(dev):
    """VK_NV_cooperative_matrix2 (which the binding predates): its feature query goes
    through a hand-laid struct that a device without it ignores; the link put before
    vkCreateDevice's chain asks for workgroup scope, flexible sizes, reductions, conversions,
    per-element operations, tensor addressing and block loads and points on to the rest;
    buffers take addresses only where it is on, and it is off where $HOTSEAT_COOPMAT2=off
    or the device lacks the extension."""
    from vulkan import ffi

    import vulkan as _vk

    if "VK_NV_cooperative_matrix2" not in dev.extensions:
        assert not dev._coopmat2_features()
    if not (vk.coopmat2_asked() and "VK_NV_cooperative_matrix2" in dev.extensions):
        assert not dev.coopmat2 and dev.buffer_usage == vk.BUFFER_USAGE
    nxt = _vk.VkPhysicalDeviceVulkan11Features()
    link = ffi.cast("uint32_t*", dev._coopmat2_chain(nxt))
    assert link[0] == vk.COOPMAT2_FEATURES
    assert ffi.cast("void**", link + 2)[0] == ffi.cast("void*", ffi.addressof(nxt))
    assert [link[4 + i] for i in range(7)] == [1, 1, 1, 1, 1, 1, 1]
    assert dev.api_version >= _vk.VK_MAKE_VERSION(1, 2, 0)


def test_the_workgroup_scope_setting(monkeypatch):
    """Off, a device opens at Vulkan 1.2, without them; unset or on asks for 1.3 (mul_mat
    _cm2's SPIR-V 1.6) where the loader has it; any other value names the setting."""
    import vulkan as _vk

    monkeypatch.setenv("HOTSEAT_COOPMAT2", "off")
    assert not vk.coopmat2_asked()
    assert vk._instance_version() == _vk.VK_MAKE_VERSION(1, 2, 0)
    for value in ("", "on"):
        monkeypatch.setenv("HOTSEAT_COOPMAT2", value)
        assert vk.coopmat2_asked()
        assert vk._instance_version() >= _vk.VK_MAKE_VERSION(1, 2, 0)
    monkeypatch.setenv("HOTSEAT_COOPMAT2", "yes")
    with pytest.raises(ValueError, match="HOTSEAT_COOPMAT2"):
        vk.coopmat2_asked()


def test_allocator_labels_kinds_and_frees(dev):
    a = dev.allocator
    before = a.totals()
    bufs = [a.alloc(1000 + i, f"t{i}", kind) for i, kind in
            enumerate(["weights", "kv", "compute", "scratch", "recurrent"])]
    totals = a.totals()
    for b in bufs:
        assert totals[b.kind] - before[b.kind] == b.nbytes
    for b in bufs:
        a.free(b)
        assert b.released
    a.free(bufs[0])                      # freeing twice is harmless
    assert a.totals() == before
    with pytest.raises(ValueError, match="unknown buffer kind"):
        a.alloc(16, "x", "mystery")


def test_suballocations_do_not_overlap(dev):
    a = dev.allocator
    bufs = [a.alloc(4096 * (i + 1), f"b{i}", "compute") for i in range(20)]
    for i, b in enumerate(bufs):
        vk.upload(dev, b, np.full(b.nbytes, i, np.uint8))
    for i, b in enumerate(bufs):
        assert (vk.download(dev, b) == i).all()
    for b in bufs[::2]:
        a.free(b)
    again = [a.alloc(4096, f"c{i}", "compute") for i in range(10)]
    for b in again:
        vk.upload(dev, b, np.full(4096, 255, np.uint8))
    for i, b in enumerate(bufs[1::2]):
        assert (vk.download(dev, b) == 2 * i + 1).all()
    for b in bufs[1::2] + again:
        a.free(b)


def test_staged_uploads_cross_staging_buffers(dev):
    """The discrete-GPU path: many writes packed through two small staging buffers."""
    rng = np.random.default_rng(0)
    datas = [rng.integers(0, 256, n, dtype=np.uint8) for n in (10, 70_000, 5, 200_000, 4096)]
    bufs = [dev.allocator.alloc(d.nbytes + 64, "u", "weights") for d in datas]
    with vk.Uploader(dev, staging_bytes=65536, direct=False) as up:
        for b, d in zip(bufs, datas):
            up.write(b, d, offset=64)
    for b, d in zip(bufs, datas):
        assert np.array_equal(vk.download(dev, b)[64:], d)
        dev.allocator.free(b)


def test_pipeline_cache_is_written(tmp_path):
    d = vk.Device(cache_dir=str(tmp_path))
    try:
        from engine.gpu.kernels import KernelCache
        kc = KernelCache(d)
        kc.get("add")
        kc.close()
    finally:
        d.close()
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].stat().st_size > 0
    d2 = vk.Device(cache_dir=str(tmp_path))       # and read back
    d2.close()


def test_emptied_blocks_are_kept_as_spares_within_the_limit(dev):
    """A freed block is reused by the next allocation (no vkAllocateMemory on a switch),
    kept only while everything reserved fits spare_limit, and trim() gives it back."""
    a = dev.allocator
    size = vk.BLOCK_BYTES + (1 << 20)             # a dedicated block of its own
    a.spare_limit = a.reserved_bytes() + size + (1 << 20)
    try:
        first = a.alloc(size, "big", "weights")
        memory = first.block.memory
        a.free(first)
        assert a.spare_bytes() >= size and a.reserved_bytes() >= size
        second = a.alloc(size - 4096, "big-again", "weights")
        assert second.block.memory == memory and a.spare_bytes() == 0
        vk.upload(dev, second, np.full(second.nbytes, 7, np.uint8))
        assert (vk.download(dev, second) == 7).all()
        a.free(second)
        assert a.trim() >= size and a.spare_bytes() == 0
        # past the limit, an emptied block goes back at once
        a.spare_limit = 0
        third = a.alloc(size, "big", "weights")
        a.free(third)
        assert a.spare_bytes() == 0
    finally:
        a.spare_limit = 0
        a.trim()


def test_host_import_covers_whole_pages_and_copies_from_them(dev):
    if not dev.host_import_align:
        pytest.skip(f"{dev.name} lacks VK_EXT_external_memory_host")
    page = dev.host_import_align
    raw = np.random.default_rng(1).integers(0, 255, 10 * page + 300, dtype=np.uint8)
    region = raw[100:]                       # starts off a page boundary
    imp = vk.HostImport(dev, region, "t", chunk_bytes=3 * page)
    try:
        base = int(vk.ffi.cast("uintptr_t", vk.ffi.from_buffer(region)))
        head = -(-base // page) * page - base
        assert imp.chunks and imp.chunks[0][0] == head
        assert all(n <= 3 * page for _, n, _ in imp.chunks)
        assert imp.spans(0, 16) is None                      # the partial first page
        assert imp.spans(region.nbytes - 8, 8) is None       # and the last
        lo, n = head + page - 40, 2 * page + 80              # across two chunks
        spans = imp.spans(lo, n)
        assert spans is not None and len(spans) == 2 and sum(k for *_, k in spans) == n
        dst = dev.allocator.alloc(n, "dst", "scratch")
        try:
            with dev.one_shot() as cmd:
                pos = 0
                for buf, off, k in spans:
                    vk.copy_buffer(cmd, buf, off, dst, pos, k)
                    pos += k
            assert (vk.download(dev, dst) == region[lo:lo + n]).all()
        finally:
            dev.allocator.free(dst)
    finally:
        imp.close()


def test_copy_stream_sends_batches_without_waiting_and_delivers_every_byte(dev):
    """Batches go to the device as they are submitted; wait() delivers all of them, and a
    shader-side reader after them (here a download's copy) sees the bytes."""
    rng = np.random.default_rng(5)
    data = [rng.integers(0, 255, n, dtype=np.uint8) for n in (3 << 20, 1 << 16, 12345 * 16)]
    srcs = [dev.allocator.alloc(d.nbytes, f"src{i}", "staging", host=True)
            for i, d in enumerate(data)]
    dsts = [dev.allocator.alloc(d.nbytes + 4096, f"dst{i}", "weights")
            for i, d in enumerate(data)]
    try:
        for s, d in zip(srcs, data):
            s.view[:d.nbytes] = d
        stream = vk.CopyStream(dev)
        for i, (s, t, d) in enumerate(zip(srcs, dsts, data)):
            half = d.nbytes // 32 * 16
            # two regions per batch, the second one at a shifted destination
            stream.copy(s, t, [(0, 0, half), (half, half + 4096, d.nbytes - half)])
            stream.submit()
        assert stream.batches == 3 and stream.bytes == sum(d.nbytes for d in data)
        stream.wait()
        assert stream.done()
        for t, d in zip(dsts, data):
            got = vk.download(dev, t)
            half = d.nbytes // 32 * 16
            assert np.array_equal(got[:half], d[:half])
            assert np.array_equal(got[half + 4096:d.nbytes + 4096], d[half:])
    finally:
        for b in srcs + dsts:
            dev.allocator.free(b)


@pytest.mark.parametrize("share", ["export", "import"])
def test_a_shared_block_with_buffer_addresses_hands_the_driver_its_whole_chain(monkeypatch,
                                                                               share):
    """The flags asking for buffer addresses link to the export (or import) request: that
    request must still hold its values when vkAllocateMemory reads it, not freed memory."""
    class Dev:
        buffer_usage = vk.BUFFER_USAGE | vk.SHADER_DEVICE_ADDRESS

    seen = {}

    def allocate(dev, size, type_index, pnext):
        for _ in range(64):      # reuse whatever memory the chain's structs may have left
            vk.ffi.new("VkExportMemoryAllocateInfo*", {"sType": 0, "handleTypes": 0})
            vk.ffi.new("VkImportMemoryFdInfoKHR*", {"sType": 0, "handleType": 0, "fd": -7})
        flags = vk.ffi.cast("VkMemoryAllocateFlagsInfo*", pnext)
        seen["flags"] = (flags.sType, flags.flags)
        if share == "export":
            link = vk.ffi.cast("VkExportMemoryAllocateInfo*", flags.pNext)
            seen["link"] = (link.sType, link.handleTypes)
        else:
            link = vk.ffi.cast("VkImportMemoryFdInfoKHR*", flags.pNext)
            seen["link"] = (link.sType, link.handleType, link.fd)
        raise StopIteration

    monkeypatch.setattr(vk, "_allocate_memory", allocate)
    with pytest.raises(StopIteration):
        vk._Block(Dev(), 0, 1 << 20, **({"export": True} if share == "export" else {"fd": 5}))
    assert seen["flags"] == (vk._vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                             vk.ALLOCATE_DEVICE_ADDRESS)
    if share == "export":
        assert seen["link"] == (vk._vk.VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                                vk.OPAQUE_FD)
    else:
        assert seen["link"] == (vk._vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                vk.OPAQUE_FD, 5)
