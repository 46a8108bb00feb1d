"""The start-at-login entry in $XDG_CONFIG_HOME/autostart."""
from __future__ import annotations

import configparser
import os

from app import autostart

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entry(path: str) -> dict:
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(path)
    return dict(cp["Desktop Entry"])


def test_enable_writes_and_disable_removes(tmp_path):
    path = autostart.autostart_path()
    assert path == str(tmp_path / "xdg" / "autostart" / "hotseat.desktop")
    assert not autostart.is_enabled()
    assert autostart.set_enabled(True) == path and autostart.is_enabled()
    e = entry(path)
    assert e["Type"] == "Application" and e["Name"] == "Hotseat" and e["Exec"]
    autostart.set_enabled(False)
    assert not os.path.exists(path)
    autostart.set_enabled(False)                                 # already gone: fine


def test_entry_matches_the_packaged_desktop_file():
    packaged = entry(os.path.join(ROOT, "packaging", "hotseat.desktop"))
    assert packaged["Exec"] == "hotseat-tray"
    path = autostart.set_enabled(True)
    mine = entry(path)
    for key in ("Type", "Name", "Comment", "Icon", "Categories", "Terminal"):
        assert mine[key] == packaged[key], key
