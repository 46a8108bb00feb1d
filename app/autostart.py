"""Start at login: the XDG autostart entry `$XDG_CONFIG_HOME/autostart/hotseat.desktop`.

The entry is the same desktop entry as `packaging/hotseat.desktop`, with Exec pointing at
whatever started this process (a PyInstaller bundle, the `hotseat-tray` script, or
`python -m app.main`), so login starts the same install.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys

ENTRY = """\
[Desktop Entry]
Type=Application
Name=Hotseat
GenericName=Local LLM switcher
Comment=Several local LLMs taking turns on one GPU
Exec={exec}
Icon=hotseat
Terminal=false
Categories=Utility;Development;
Keywords=LLM;GGUF;GPU;VRAM;
StartupNotify=false
X-GNOME-Autostart-enabled=true
"""


def autostart_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "autostart", "hotseat.desktop")


def exec_line() -> str:
    if getattr(sys, "frozen", False):
        return shlex.quote(sys.executable)
    script = shutil.which("hotseat-tray")
    if script:
        return "hotseat-tray"
    return f"{shlex.quote(sys.executable)} -m app.main"


def is_enabled() -> bool:
    return os.path.exists(autostart_path())


def set_enabled(enabled: bool) -> str:
    """Write or remove the entry; returns its path."""
    path = autostart_path()
    if enabled:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            # at login only the tray icon; the window opens from it
            f.write(ENTRY.format(exec=exec_line() + " --minimized"))
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    return path
