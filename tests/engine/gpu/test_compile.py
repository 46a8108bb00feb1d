"""The shader build's choice of compiler: GL_NV_cooperative_matrix2's kernels need a glslang
of 15 or later, named by $HOTSEAT_GLSLANG or found on PATH; an older one is not taken, and
without one those kernels come from the shipped modules made from the same sources, or are
skipped (the others build)."""
from __future__ import annotations

import os

import pytest

from shaders import compile as shader_compile


def fake_glslang(tmp_path, version: str) -> str:
    exe = tmp_path / f"glslang-{version}"
    exe.write_text(f"#!/bin/sh\necho 'Glslang Version: 11:{version}'\n"
                   f"echo 'ESSL Version: OpenGL ES GLSL 3.20 glslang Khronos. {version}'\n")
    exe.chmod(0o755)
    return str(exe)


def test_a_new_enough_glslang_is_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSEAT_GLSLANG", fake_glslang(tmp_path, "16.1.0"))
    assert shader_compile.glslang2() == os.environ["HOTSEAT_GLSLANG"]


def test_an_old_glslang_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(shader_compile, "glslang", lambda: fake_glslang(tmp_path, "14.3.0"))
    for named in (fake_glslang(tmp_path, "13.1.1"), str(tmp_path / "nowhere"), str(tmp_path)):
        monkeypatch.setenv("HOTSEAT_GLSLANG", named)    # old, missing, not a program
        with pytest.raises(shader_compile.CompilerMissing, match="HOTSEAT_GLSLANG"):
            shader_compile.glslang2()


def test_without_one_the_shipped_modules_are_taken_while_their_sources_match(tmp_path,
                                                                            monkeypatch):
    """No glslang of 15: a workgroup-scope variant comes from shaders/prebuilt/ while the
    hash of its sources is the one it was made from; once they change it is skipped (no
    module written) as without a shipped one."""
    monkeypatch.setenv("HOTSEAT_GLSLANG", fake_glslang(tmp_path, "13.1.1"))
    monkeypatch.setattr(shader_compile, "glslang", lambda: fake_glslang(tmp_path, "13.1.1"))
    monkeypatch.setattr(shader_compile, "SPV_DIR", str(tmp_path / "spv"))
    args = ("mul_mat_cm2_Q4_K", "mul_mat_cm2.comp", ("TYPE_Q4_K",), "glslang2")
    made = shader_compile.compile_variant(*args, force=True)
    with open(made, "rb") as f, \
            open(os.path.join(shader_compile.PREBUILT, "mul_mat_cm2_Q4_K.spv"), "rb") as g:
        assert f.read() == g.read()
    os.remove(made)
    monkeypatch.setattr(shader_compile, "sources_hash", lambda source, defines: "edited")
    with pytest.raises(shader_compile.CompilerMissing):
        shader_compile.compile_variant(*args, force=True)
    assert not os.path.exists(made)


def test_the_shipped_modules_are_made_from_the_sources_as_they_are():
    """Every workgroup-scope variant ships (SPIR-V, by its magic number) with the hash of
    its sources as they are now; no other module ships. Fails after an edit to such a
    kernel or an include it reaches until `python shaders/compile.py --prebuild` (with a
    glslang of 15 or later) makes them again."""
    from shaders.registry import VARIANTS

    wanted = {v: (src, defs) for v, (src, defs, tool) in VARIANTS.items() if tool == "glslang2"}
    shipped = {n[:-4] for n in os.listdir(shader_compile.PREBUILT) if n.endswith(".spv")}
    assert shipped == set(wanted)
    stale = [v for v, (src, defs) in sorted(wanted.items())
             if shader_compile._prebuilt(v, src, defs) is None]
    assert not stale, f"run python shaders/compile.py --prebuild: {stale} are stale"
    for v in wanted:
        with open(os.path.join(shader_compile.PREBUILT, v + ".spv"), "rb") as f:
            assert f.read(4) == b"\x03\x02\x23\x07"


def test_a_variant_hashes_the_includes_it_reaches_and_only_those():
    """The hash follows #include chains (mul_mat_cm2 reaches cm2_decode.glsl and what that
    includes), not every file in include/."""
    reached = {os.path.basename(p) for p in shader_compile._reached("mul_mat_cm2.comp")}
    assert {"mul_mat_cm2.comp", "cm2_decode.glsl"} <= reached
    assert "delta.glsl" not in reached


@pytest.mark.parametrize("garbage", [b"", b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_damaged_hash_file_ships_nothing(tmp_path, monkeypatch, garbage):
    """A hash file that is empty, not JSON or not a table: no shipped module is taken (the
    variant is skipped as without one), and nothing is written."""
    hashes = tmp_path / "sources.json"
    hashes.write_bytes(garbage)
    monkeypatch.setattr(shader_compile, "HASHES", str(hashes))
    monkeypatch.setenv("HOTSEAT_GLSLANG", fake_glslang(tmp_path, "13.1.1"))
    monkeypatch.setattr(shader_compile, "glslang", lambda: fake_glslang(tmp_path, "13.1.1"))
    monkeypatch.setattr(shader_compile, "SPV_DIR", str(tmp_path / "spv"))
    assert shader_compile._prebuilt("mul_mat_cm2_Q4_K", "mul_mat_cm2.comp", ("TYPE_Q4_K",)) is None
    with pytest.raises(shader_compile.CompilerMissing):
        shader_compile.compile_variant("mul_mat_cm2_Q4_K", "mul_mat_cm2.comp", ("TYPE_Q4_K",),
                                       "glslang2", force=True)
    assert not os.path.exists(tmp_path / "spv" / "mul_mat_cm2_Q4_K.spv")

