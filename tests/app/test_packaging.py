"""The packaging files: the desktop entry, and the PyInstaller bundle built from
packaging/hotseat.spec, started with --headless-check (skipped only where PyInstaller is not
installed)."""
from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_desktop_entry_runs_the_tray_script():
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(os.path.join(ROOT, "packaging", "hotseat.desktop"))
    e = cp["Desktop Entry"]
    assert e["Type"] == "Application" and e["Exec"] == "hotseat-tray"
    assert e["Icon"] == "hotseat" and e["Terminal"] == "false"


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.slow
def test_pyinstaller_bundle_starts(tmp_path):
    pytest.importorskip("PyInstaller")
    dist, work = tmp_path / "dist", tmp_path / "build"
    build = subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "ERROR",
         "--distpath", str(dist), "--workpath", str(work),
         os.path.join(ROOT, "packaging", "hotseat.spec")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    exe = dist / "hotseat-tray" / "hotseat-tray"
    assert exe.exists()
    internal = dist / "hotseat-tray" / "_internal"
    assert list((internal / "shaders" / "spv").glob("*.spv"))
    assert (internal / "resources" / "hotseat.svg").exists()
    plugins = internal / "PySide6" / "Qt" / "plugins"
    for plugin in ("platforms/libqxcb.so", "platforms/libqoffscreen.so",
                   "iconengines/libqsvgicon.so", "imageformats/libqsvg.so"):
        assert (plugins / plugin).exists(), plugin

    cmd = [str(exe), "--headless-check"]
    try:
        from engine.formats.bundled import smollm2_path
        cmd += ["--model", smollm2_path()]           # a load and two tokens, in the bundle
    except Exception:                                # no embedded model: the UI and device
        pass
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                         cwd=str(tmp_path))                 # not the checkout: bundle only
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["platform"] == "offscreen" and report["spv_modules"] > 0
    assert report["device"]
    if "--model" in cmd:
        assert report["generated"] and report["model_rows"] == 1
