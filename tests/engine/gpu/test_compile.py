"""The shader build's choice of compiler: GL_NV_cooperative_matrix2's kernels need a glslang
of 15 or later, named by $HOTSEAT_GLSLANG or found on PATH; an older one is not taken, and
without one those kernels are skipped (the others build)."""
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


def test_without_one_the_workgroup_scope_kernels_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTSEAT_GLSLANG", fake_glslang(tmp_path, "13.1.1"))
    monkeypatch.setattr(shader_compile, "glslang", lambda: fake_glslang(tmp_path, "13.1.1"))
    monkeypatch.setattr(shader_compile, "SPV_DIR", str(tmp_path / "spv"))
    with pytest.raises(shader_compile.CompilerMissing):
        shader_compile.compile_variant("mul_mat_cm2_Q4_K", "mul_mat_cm2.comp",
                                       ("TYPE_Q4_K",), "glslang2", force=True)
    assert not os.path.exists(tmp_path / "spv" / "mul_mat_cm2_Q4_K.spv")
