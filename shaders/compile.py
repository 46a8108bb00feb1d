"""Compile every kernel variant to SPIR-V with glslc.

The variant table lives in registry.py (VARIANTS: name -> (source, defines)); this
script is what `pip install` (setup.py's build step) and the engine (when a .spv is missing
or older than its sources) run. Output: shaders/spv/<variant>.spv.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SPV_DIR = os.path.join(HERE, "spv")
INCLUDE = os.path.join(HERE, "include")


def glslc() -> str:
    exe = shutil.which("glslc")
    if not exe:
        raise RuntimeError("glslc not found: apt-get install glslc (or set it on PATH)")
    return exe


def _newest_input(source: str) -> float:
    times = [os.path.getmtime(os.path.join(HERE, source))]
    times += [os.path.getmtime(os.path.join(INCLUDE, f)) for f in os.listdir(INCLUDE)]
    return max(times)


def spv_path(variant: str) -> str:
    return os.path.join(SPV_DIR, variant + ".spv")


def compile_variant(variant: str, source: str, defines: tuple[str, ...], force: bool = False) -> str:
    out = spv_path(variant)
    if not force and os.path.exists(out) and os.path.getmtime(out) >= _newest_input(source):
        return out
    os.makedirs(SPV_DIR, exist_ok=True)
    cmd = [glslc(), "-fshader-stage=compute", "--target-env=vulkan1.2", "-O", "-I", INCLUDE]
    cmd += [f"-D{d}" for d in defines]
    tmp = out + f".{os.getpid()}.tmp"
    cmd += [os.path.join(HERE, source), "-o", tmp]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"glslc failed for {variant}:\n{res.stderr}")
    os.replace(tmp, out)
    return out


def compile_all(force: bool = False) -> list[str]:
    sys.path.insert(0, os.path.dirname(HERE))
    from shaders.registry import VARIANTS

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = [pool.submit(compile_variant, v, src, defs, force)
                for v, (src, defs) in VARIANTS.items()]
        return [j.result() for j in jobs]


if __name__ == "__main__":
    paths = compile_all(force="--force" in sys.argv)
    print(f"{len(paths)} SPIR-V modules in {SPV_DIR}")
