"""The arena's shared VRAM pool (engine/residency/pool.py) between two devices, as two
processes would use it: memory one allocator made is imported by the other (the bytes one
wrote are the other's to read), kept mapped and reused without another import, given back
to the device when both drop it, and a stale manifest is pruned."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from engine.gpu import vk
from engine.residency.arena import prepare_dir
from engine.residency.pool import POOL_BLOCK, POOL_FILE, SharedPool

pytestmark = pytest.mark.gpu


@pytest.fixture
def two(tmp_path):
    d = prepare_dir(str(tmp_path / "arena"))
    devs = [vk.Device(), vk.Device()]
    if not devs[0].shares_memory:
        for dev in devs:
            dev.close()
        pytest.skip("the driver does not share memory as opaque fds")
    pools = [SharedPool(d, dev) for dev in devs]
    for dev, pool in zip(devs, pools):
        dev.allocator.pool = pool
    yield d, devs, pools
    for dev in devs:
        dev.close()                      # closes its pool too


def test_memory_made_by_one_is_imported_by_the_other_and_kept(two):
    d, (da, db), (pa, pb) = two
    data = np.random.default_rng(7).integers(0, 255, 1 << 20, dtype=np.uint8)
    buf = da.allocator.alloc(data.nbytes, "a-weights", "weights")
    vk.upload(da, buf, data)
    assert pa.stats["created"] == 1 and buf.block.size >= POOL_BLOCK
    manifest = json.load(open(os.path.join(d, POOL_FILE)))["blocks"]
    assert [b["id"] for b in manifest] == [buf.block.pool_id]
    da.allocator.free(buf)                # a's turn ends: the block stays mapped, idle
    assert da.allocator.reserved_bytes() == 0 and pa.idle_bytes() == POOL_BLOCK

    got = db.allocator.alloc(data.nbytes, "b-weights", "weights")
    assert pb.stats == {**pb.stats, "created": 0, "imported": 1}
    assert got.block.pool_id == manifest[0]["id"]
    assert np.array_equal(vk.download(db, got)[:data.nbytes], data)   # the same memory
    vk.upload(db, got, data[::-1].copy())
    db.allocator.free(got)

    again = da.allocator.alloc(data.nbytes, "a-weights", "weights")   # a's next turn
    assert pa.stats["created"] == 1 and pa.stats["imported"] == 0
    assert np.array_equal(vk.download(da, again)[:data.nbytes], data[::-1])
    da.allocator.free(again)
    again_b = db.allocator.alloc(4096, "b-kv", "kv")
    assert pb.stats["imported"] == 1 and pb.stats["created"] == 0
    db.allocator.free(again_b)


def test_a_block_larger_than_the_pool_has_is_made_and_listed(two):
    d, (da, db), (pa, pb) = two
    small = da.allocator.alloc(1 << 20, "small", "kv")
    big = da.allocator.alloc(POOL_BLOCK + (1 << 20), "big", "weights")
    assert pa.stats["created"] == 2 and big.block.size >= POOL_BLOCK + (1 << 20)
    big_id = big.block.pool_id
    da.allocator.free(small)
    da.allocator.free(big)
    got = db.allocator.alloc(POOL_BLOCK + 4096, "b-big", "weights")
    assert pb.stats["imported"] == 1 and pb.stats["created"] == 0
    assert got.block.pool_id == big_id            # the one block large enough
    db.allocator.free(got)


def test_dropped_by_both_the_memory_is_gone_and_the_manifest_pruned(two, tmp_path):
    d, (da, db), (pa, pb) = two
    buf = da.allocator.alloc(1 << 20, "a", "weights")
    first = buf.block.pool_id
    da.allocator.free(buf)
    got = db.allocator.alloc(1 << 20, "b", "weights")
    db.allocator.free(got)
    assert pa.drop_idle() == POOL_BLOCK and pb.drop_idle() == POOL_BLOCK
    assert pa.mapped_bytes() == pb.mapped_bytes() == 0
    # nobody serves the listed block any more: the next turn makes a new one, listed alone
    fresh = da.allocator.alloc(1 << 20, "a", "weights")
    assert pa.stats["created"] == 2 and fresh.block.pool_id != first
    manifest = json.load(open(os.path.join(d, POOL_FILE)))["blocks"]
    assert [b["id"] for b in manifest] == [fresh.block.pool_id]
    da.allocator.free(fresh)


def test_a_block_in_use_is_never_dropped(two):
    d, (da, _), (pa, _) = two
    buf = da.allocator.alloc(1 << 20, "a", "weights")
    assert pa.drop_idle() == 0 and pa.mapped_bytes() == POOL_BLOCK
    vk.upload(da, buf, np.ones(1 << 20, np.uint8))
    assert (vk.download(da, buf) == 1).all()
    da.allocator.free(buf)
    assert pa.drop_idle() == POOL_BLOCK


def test_garbage_in_the_manifest_or_on_a_socket_is_ignored(two):
    """A manifest that is not the pool's JSON reads as empty (a new block is made and listed),
    and a member's socket answers garbage with no fds and goes on serving."""
    import socket

    d, (da, db), (pa, pb) = two
    with open(os.path.join(d, POOL_FILE), "wb") as f:
        f.write(b'\x00{"blocks": [{"id": 5}]')
    buf = da.allocator.alloc(1 << 20, "a", "weights")
    assert pa.stats["created"] == 1
    assert [b["id"] for b in json.load(open(os.path.join(d, POOL_FILE)))["blocks"]] == \
        [buf.block.pool_id]
    da.allocator.free(buf)
    for junk in (b"not json\n", b'{"ids": "x"}\n', b'{"ids": [1, null, "zz"]}\n', b"\xff\n"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(pa.sock_path)
        s.sendall(junk)
        msg, fds, _, _ = socket.recv_fds(s, 4096, 8)
        s.close()
        assert fds == [] and json.loads(msg) == {"ids": []}, junk
    got = db.allocator.alloc(1 << 20, "b", "weights")      # a still serves its block
    assert pb.stats["imported"] == 1
    db.allocator.free(got)
