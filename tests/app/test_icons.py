"""The icon: the hand-written SVG and its PNG renders."""
from __future__ import annotations

import os

from PySide6.QtGui import QImage

from app.icons import PNG_SIZES, app_icon, painted_icon, resources_dir


def test_svg_and_pngs_are_there_and_valid(qapp):
    from PySide6.QtSvg import QSvgRenderer

    d = resources_dir()
    assert QSvgRenderer(os.path.join(d, "hotseat.svg")).isValid()
    for size in PNG_SIZES:
        img = QImage(os.path.join(d, f"hotseat-{size}.png"))
        assert (img.width(), img.height()) == (size, size)
        assert img.pixelColor(size // 2, size // 2).alpha() == 255       # the die
        assert img.pixelColor(0, 0).alpha() == 0                         # a transparent corner


def test_app_icon_has_every_size(qapp):
    icon = app_icon()
    assert not icon.isNull()
    sizes = {s.width() for s in icon.availableSizes()}
    assert set(PNG_SIZES) <= sizes


def test_painted_stand_in(qapp):
    pm = painted_icon(32)
    assert pm.width() == 32 and not pm.toImage().pixelColor(16, 16).alpha() == 0
