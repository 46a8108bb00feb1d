"""GGUFFile on bad input: every problem is a one-line ModelFileError naming the file, fast."""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.formats.gguf_file import GGUFFile, ModelFileError

Q8_0 = gguf.GGMLQuantizationType.Q8_0
ALIGNMENT = 32


class Hung(BaseException):
    """Raised by the alarm; a BaseException so no `except Exception` in the loader eats it."""


@contextlib.contextmanager
def time_limit(seconds: int):
    def on_alarm(signum, frame):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def load(path: Path, seconds: int = 10) -> GGUFFile:
    try:
        with time_limit(seconds):
            return GGUFFile(path)
    except Hung as exc:
        pytest.fail(f"GGUFFile({path}) hung: {exc}")


def check_error(exc: ModelFileError, path: Path, words: str) -> None:
    msg = str(exc)
    assert "\n" not in msg and "\r" not in msg, f"message is not one line: {msg!r}"
    assert os.fspath(path) in msg, f"message does not name the file: {msg!r}"
    assert re.search(words, msg, re.I), f"message lacks /{words}/: {msg!r}"


def expect_error(path: Path, words: str) -> str:
    with pytest.raises(ModelFileError) as info:
        load(path)
    check_error(info.value, path, words)
    return str(info.value)


# -- a small valid file and where its parts are --------------------------------------------
F32_DATA = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
Q8_SOURCE = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)


def write_valid(path: Path) -> Path:
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_custom_alignment(ALIGNMENT)
    w.add_name("tiny")
    w.add_uint32("tiny.context_length", 64)
    w.add_float32("tiny.eps", 1e-5)
    w.add_bool("tiny.flag", True)
    w.add_key_value("tiny.bytes", [1, 2, 3, 4, 5], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.UINT8)
    w.add_key_value("tiny.aaaa", 1, gguf.GGUFValueType.UINT32)
    w.add_key_value("tiny.bbbb", 2, gguf.GGUFValueType.UINT32)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "hello", "world", "\u00e9t\u00e9"])
    w.add_tensor("a.weight", F32_DATA)
    w.add_tensor("b.weight", gguf.quants.quantize(Q8_SOURCE, Q8_0), raw_dtype=Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Layout:
    """Byte offsets inside the valid file, found by gguf-py's reader (the reference)."""

    def __init__(self, path: Path):
        r = gguf.GGUFReader(os.fspath(path), "r")
        self.size = path.stat().st_size
        self.kv = {k: f.offset for k, f in r.fields.items()}
        self.kv_value = {k: f.offset + sum(int(p.nbytes) for p in f.parts[:3])
                         for k, f in r.fields.items() if not k.startswith("GGUF.")}
        first_info = r.tensors[0].field.offset
        self.kv_end = first_info
        self.info = {}
        for t in r.tensors:
            name_len, name, n_dims, dims, ttype, toff = t.field.parts
            start = t.field.offset
            dims_at = start + name_len.nbytes + name.nbytes + n_dims.nbytes
            self.info[t.name] = {
                "start": start, "n_dims": dims_at - n_dims.nbytes, "dims": dims_at,
                "type": dims_at + dims.nbytes, "offset": dims_at + dims.nbytes + 4,
                "end": dims_at + dims.nbytes + 12,
            }
        self.data_offset = r.data_offset
        self.data = {t.name: (t.data_offset, t.n_bytes) for t in r.tensors}


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> tuple[bytes, Layout]:
    path = write_valid(tmp_path_factory.mktemp("valid") / "tiny.gguf")
    return path.read_bytes(), Layout(path)


def patched(data: bytes, at: int, fmt: str, *values) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


def test_valid_file_loads(tmp_path):
    path = write_valid(tmp_path / "tiny.gguf")
    with load(path) as f:
        assert f.arch == "llama"
        assert f.get("general.name") == "tiny"
        assert f.get("tiny.context_length") == 64
        assert f.get("tiny.bytes") == [1, 2, 3, 4, 5]
        assert f.get("tokenizer.ggml.tokens")[-1] == "\u00e9t\u00e9"
        a, b = f.tensor("a.weight"), f.tensor("b.weight")
        assert a.shape == (8, 4) and a.type_name == "F32" and a.nbytes == F32_DATA.nbytes
        assert b.shape == (64, 2) and b.type_name == "Q8_0" and b.nbytes == 2 * 2 * 34
        np.testing.assert_array_equal(f.dequantize("a.weight"), F32_DATA)
        want = gguf.quants.dequantize(gguf.quants.quantize(Q8_SOURCE, Q8_0), Q8_0)
        np.testing.assert_array_equal(f.dequantize("b.weight"), want)


def same_as_gguf_py(path) -> None:
    """Metadata and tensors as gguf-py's own reader gives them, value for value and type
    for type."""
    ref = gguf.GGUFReader(os.fspath(path), "r")
    want = {k: fld.contents() for k, fld in ref.fields.items()}
    with load(Path(path), seconds=60) as f:
        assert list(f.metadata) == list(want)
        for k, v in want.items():
            assert f.metadata[k] == v and type(f.metadata[k]) is type(v), k
        assert list(f.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            mine = f.tensors[t.name]
            assert mine.shape == tuple(int(d) for d in t.shape), t.name
            assert (mine.offset, mine.nbytes) == (t.data_offset, t.n_bytes), t.name
            assert np.array_equal(mine.data, np.asarray(t.data).reshape(-1).view(np.uint8))
            assert not mine.data.flags.writeable


def test_every_value_type_reads_as_gguf_py_reads_it(tmp_path):
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    T = gguf.GGUFValueType
    for i, (vtype, value) in enumerate([
            (T.UINT8, 200), (T.INT8, -100), (T.UINT16, 60000), (T.INT16, -30000),
            (T.UINT32, 4_000_000_000), (T.INT32, -2_000_000_000), (T.FLOAT32, 0.1),
            (T.BOOL, True), (T.BOOL, False), (T.STRING, "caf\u00e9 \U0001f600"),
            (T.UINT64, 1 << 63), (T.INT64, -(1 << 62)), (T.FLOAT64, 0.1)]):
        w.add_key_value(f"t.scalar{i}", value, vtype)
    w.add_key_value("t.f32s", [0.5, -1.25, 3.0e-8], T.ARRAY, sub_type=T.FLOAT32)
    w.add_key_value("t.i64s", [-1, 2, 1 << 40], T.ARRAY, sub_type=T.INT64)
    w.add_key_value("t.bools", [True, False, True], T.ARRAY, sub_type=T.BOOL)
    w.add_array("t.strings", ["", "a", "\u00e9t\u00e9", "x" * 300])
    w.add_array("t.empty", [])
    w.add_array("t.nested", [[1, 2], [3], [4, 5, 6]])     # gguf-py flattens these
    w.add_tensor("a.weight", F32_DATA)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    same_as_gguf_py(path)


def test_bundled_model_reads_as_gguf_py_reads_it(smollm2_path):
    same_as_gguf_py(smollm2_path)


# -- targeted corruptions -------------------------------------------------------------------
# Each builds the broken bytes from the valid ones and names the words its message must use.
TRUNC = r"truncat"
CORRUPT = r"truncat|corrupt|absurd"
ANY_PROBLEM = r"truncat|corrupt|absurd|type|utf-?8|duplicate|dimension|shape|align|block"


CASES = {
    # truncations
    "cut-in-magic": (lambda d, l: d[:3], TRUNC),
    "cut-in-header": (lambda d, l: d[:16], TRUNC),
    "cut-after-header": (lambda d, l: d[:24], TRUNC),
    "cut-in-key-name": (lambda d, l: d[:l.kv["tiny.context_length"] + 10], TRUNC),
    "cut-in-value": (lambda d, l: d[:l.kv_value["tiny.eps"] + 2], TRUNC),
    "cut-in-string-array": (lambda d, l: d[:l.kv_value["tokenizer.ggml.tokens"] + 20], TRUNC),
    "cut-before-infos": (lambda d, l: d[:l.kv_end], TRUNC),
    "cut-in-info-name": (lambda d, l: d[:l.info["b.weight"]["start"] + 9], TRUNC),
    "cut-in-info-dims": (lambda d, l: d[:l.info["b.weight"]["dims"] + 4], TRUNC),
    "cut-in-info-offset": (lambda d, l: d[:l.info["b.weight"]["offset"] + 3], TRUNC),
    "cut-at-data-start": (lambda d, l: d[:l.data_offset], TRUNC),
    "cut-in-first-tensor": (lambda d, l: d[:l.data["a.weight"][0] + 7], TRUNC),
    "cut-in-last-tensor": (lambda d, l: d[:sum(l.data["b.weight"]) - 5], TRUNC),
    # header fields
    "wrong-magic": (lambda d, l: b"GGML" + d[4:], r"magic"),
    "zero-magic": (lambda d, l: bytes(4) + d[4:], r"magic"),
    "version-1": (lambda d, l: patched(d, 4, "<I", 1), r"version"),
    "version-99": (lambda d, l: patched(d, 4, "<I", 99), r"version"),
    "big-endian-version": (lambda d, l: patched(d, 4, ">I", 3), r"version|endian"),
    "absurd-tensor-count": (lambda d, l: patched(d, 8, "<Q", 1 << 60), r"absurd|corrupt"),
    "absurd-kv-count": (lambda d, l: patched(d, 16, "<Q", 1 << 60), r"absurd|corrupt"),
    "max-tensor-count": (lambda d, l: patched(d, 8, "<Q", (1 << 64) - 1), r"absurd|corrupt"),
    "large-tensor-count": (lambda d, l: patched(d, 8, "<Q", 5000), CORRUPT),
    "large-kv-count": (lambda d, l: patched(d, 16, "<Q", 60000), CORRUPT),
    # one key too many: the first tensor info gets read as a key/value pair
    "kv-count-one-more": (lambda d, l: patched(d, 16, "<Q", len(l.kv_value) + 1), ANY_PROBLEM),
    # metadata
    "absurd-key-length": (lambda d, l: patched(d, l.kv["tiny.eps"], "<Q", 1 << 62), CORRUPT),
    "key-not-utf8": (lambda d, l: patched(d, l.kv["tiny.eps"] + 8, "<B", 0xFF), r"utf-?8"),
    "duplicate-key": (lambda d, l: patched(d, l.kv["tiny.bbbb"] + 8 + 5, "4s", b"aaaa"),
                      r"duplicate"),
    "unknown-value-type": (lambda d, l: patched(d, l.kv_value["tiny.eps"] - 4, "<I", 99),
                           r"type"),
    "absurd-array-count": (lambda d, l: patched(d, l.kv_value["tiny.bytes"] + 4, "<Q", 1 << 40),
                           CORRUPT),
    "absurd-string-array-count": (
        lambda d, l: patched(d, l.kv_value["tokenizer.ggml.tokens"] + 4, "<Q", 1 << 62),
        CORRUPT),
    "unknown-array-item-type": (lambda d, l: patched(d, l.kv_value["tiny.bytes"], "<I", 77),
                                r"type"),
    "absurd-string-in-array": (
        lambda d, l: patched(d, l.kv_value["tokenizer.ggml.tokens"] + 12, "<Q", 1 << 50),
        CORRUPT),
    "alignment-not-power-of-two": (
        lambda d, l: patched(d, l.kv_value["general.alignment"], "<I", 3), r"alignment"),
    "alignment-zero": (lambda d, l: patched(d, l.kv_value["general.alignment"], "<I", 0),
                       r"alignment"),
    "alignment-wrong-type": (
        lambda d, l: patched(d, l.kv_value["general.alignment"] - 4, "<I", 5), r"alignment"),
    # tensor infos
    "unknown-tensor-type": (lambda d, l: patched(d, l.info["a.weight"]["type"], "<I", 99),
                            r"type"),
    "removed-tensor-type": (lambda d, l: patched(d, l.info["b.weight"]["type"], "<I", 4),
                            r"type"),
    "absurd-tensor-type": (lambda d, l: patched(d, l.info["b.weight"]["type"], "<I", 0xFFFFFFFF),
                           r"type"),
    "type-size-mismatch": (lambda d, l: patched(d, l.info["a.weight"]["type"], "<I", 8),
                           r"block|type|shape"),
    "absurd-n-dims": (lambda d, l: patched(d, l.info["a.weight"]["n_dims"], "<I", 1 << 30),
                      r"dimension|dims|absurd|corrupt"),
    "five-dims": (lambda d, l: patched(d, l.info["a.weight"]["n_dims"], "<I", 5),
                  r"dimension|dims|absurd|corrupt"),
    "absurd-dim": (lambda d, l: patched(d, l.info["a.weight"]["dims"], "<Q", 1 << 62),
                   r"absurd|shape"),
    "zero-dim": (lambda d, l: patched(d, l.info["a.weight"]["dims"], "<Q", 0), r"shape|empty"),
    "overflowing-dims": (lambda d, l: patched(d, l.info["a.weight"]["dims"], "<QQ",
                                              1 << 32, 1 << 32), r"absurd|shape|past|truncat"),
    "dims-past-end": (lambda d, l: patched(d, l.info["b.weight"]["dims"] + 8, "<Q", 1000),
                      r"past|truncat|shape"),
    "offset-past-end": (lambda d, l: patched(d, l.info["b.weight"]["offset"], "<Q", 1 << 40),
                        r"past|truncat"),
    "offset-misaligned": (lambda d, l: patched(d, l.info["b.weight"]["offset"], "<Q",
                                               l.data["b.weight"][0] - l.data_offset + 1),
                          r"align"),
    "duplicate-tensor": (lambda d, l: patched(d, l.info["b.weight"]["start"] + 8, "<B", ord("a")),
                         r"duplicate"),
    "tensor-name-not-utf8": (lambda d, l: patched(d, l.info["b.weight"]["start"] + 8, "<B", 0xC3),
                             r"utf-?8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_file(case, valid, tmp_path):
    data, layout = valid
    make, words = CASES[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(make(data, layout))
    expect_error(path, words)


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.gguf", r"no such file")


def test_directory(tmp_path):
    expect_error(tmp_path, r"directory")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    expect_error(path, r"empty")


@pytest.mark.parametrize("size", [7, 100, 4096, 1 << 16])
def test_random_garbage(size, tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(random.Random(size).randbytes(size))
    expect_error(path, r"magic|truncat|empty")


@pytest.mark.parametrize("seed", range(4))
def test_garbage_after_valid_header(seed, tmp_path):
    rng = random.Random(seed)
    path = tmp_path / "garbage.gguf"
    header = b"GGUF" + struct.pack("<IQQ", 3, rng.randrange(1, 4), rng.randrange(1, 8))
    path.write_bytes(header + rng.randbytes(2000))
    expect_error(path, ANY_PROBLEM)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_fifo_does_not_block(tmp_path):
    path = tmp_path / "pipe.gguf"
    os.mkfifo(path)
    expect_error(path, r"regular file")


def test_unreadable_file(tmp_path, valid):
    path = tmp_path / "locked.gguf"
    path.write_bytes(valid[0])
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # root reads anything: then it is simply a valid file
            load(path).close()
        else:
            expect_error(path, r"permission|cannot")
    finally:
        path.chmod(0o600)


def test_message_is_one_line_even_if_the_problem_is_not(tmp_path):
    exc = ModelFileError(tmp_path / "x.gguf", "first line\nsecond line\r\n")
    assert str(exc) == f"{tmp_path / 'x.gguf'}: first line second line"


# -- fuzz -----------------------------------------------------------------------------------
def _mutate(data: bytes, rng: random.Random, header_end: int) -> bytes:
    out = bytearray(data)
    kind = rng.random()
    if kind < 0.25:
        return bytes(out[:rng.randrange(len(out))])
    for _ in range(rng.randint(1, 8)):
        # Most flips land in the header, metadata and tensor infos, where parsing happens.
        end = header_end if rng.random() < 0.8 else len(out)
        at = rng.randrange(end)
        if rng.random() < 0.3:
            out[at] ^= 1 << rng.randrange(8)
        else:
            out[at] = rng.choice((0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)))
    if kind > 0.85:
        out = out[:rng.randrange(len(out))]
    return bytes(out)


def test_fuzz_flips_and_truncations(valid, tmp_path):
    data, layout = valid
    rng = random.Random(20240611)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"loaded": 0, "rejected": 0}
    for i in range(200):
        mutated = _mutate(data, rng, layout.data_offset)
        path.write_bytes(mutated)
        try:
            with time_limit(5):
                f = GGUFFile(path)
        except ModelFileError as exc:
            check_error(exc, path, r"\w")
            outcomes["rejected"] += 1
        except Hung:
            pytest.fail(f"case {i} hung; bytes: {mutated.hex()}")
        except Exception as exc:
            pytest.fail(f"case {i} raised {type(exc).__name__}: {exc}; bytes: {mutated.hex()}")
        else:
            with f:
                for t in f.tensors.values():
                    assert t.offset + t.nbytes <= len(mutated) and t.data.nbytes == t.nbytes
            outcomes["loaded"] += 1
    # Both outcomes occur, or the fuzz is not exercising anything.
    assert outcomes["loaded"] > 0 and outcomes["rejected"] > 0, outcomes
