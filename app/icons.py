"""The app icon: resources/hotseat.svg and its PNG renders, found beside the package (a
checkout or a PyInstaller bundle); a painted stand-in where resources/ is not installed."""
from __future__ import annotations

import os
import sys

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap

PNG_SIZES = (16, 32, 64, 128, 256)


def resources_dir() -> str:
    base = getattr(sys, "_MEIPASS", None) or os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))
    return os.path.join(base, "resources")


def app_icon() -> QIcon:
    d = resources_dir()
    icon = QIcon()
    for size in PNG_SIZES:
        path = os.path.join(d, f"hotseat-{size}.png")
        if os.path.exists(path):
            icon.addFile(path)
    svg = os.path.join(d, "hotseat.svg")
    if os.path.exists(svg):
        icon.addFile(svg)
    if icon.isNull():
        icon.addPixmap(painted_icon(64))
    return icon


def painted_icon(size: int) -> QPixmap:
    """A plain drawing of the same seat on a chip."""
    pm = QPixmap(size, size)
    pm.fill(Qt.GlobalColor.transparent)
    s = size / 256
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor("#9aa5b4"))
    for c in (70, 102, 138, 170):
        for rect in ((c, 14, 16, 30), (c, 212, 16, 30), (14, c, 30, 16), (212, c, 30, 16)):
            p.drawRoundedRect(QRectF(*(v * s for v in rect)), 4 * s, 4 * s)
    p.setBrush(QColor("#232b3a"))
    p.drawRoundedRect(QRectF(36 * s, 36 * s, 184 * s, 184 * s), 30 * s, 30 * s)
    p.setBrush(QColor("#f7803b"))
    p.drawRoundedRect(QRectF(86 * s, 62 * s, 84 * s, 76 * s), 18 * s, 18 * s)
    p.setBrush(QColor("#f0562a"))
    p.drawRoundedRect(QRectF(70 * s, 132 * s, 116 * s, 30 * s), 12 * s, 12 * s)
    p.setBrush(QColor("#c94421"))
    for x in (82, 158):
        p.drawRoundedRect(QRectF(x * s, 158 * s, 16 * s, 38 * s), 6 * s, 6 * s)
    p.end()
    return pm


STATE_COLORS = {"generating": QColor("#2eaf5a"), "yielded": QColor("#8a94a6"),
                "busy": QColor("#f0a020")}


def state_icon(state: str, size: int = 64) -> QIcon:
    """The app icon with a badge for the tray: "idle" (none), "generating" (a green dot),
    "busy" (amber: loading, warming), "yielded" (a grey pause sign)."""
    base = app_icon().pixmap(size, size)
    if base.isNull():
        base = painted_icon(size)
    if state not in STATE_COLORS:
        return QIcon(base)
    pm = QPixmap(base)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    d = size * 0.46
    r = QRectF(size - d - 1, size - d - 1, d, d)
    p.setPen(QColor("white"))
    p.setBrush(STATE_COLORS[state])
    p.drawEllipse(r)
    if state == "yielded":                 # two bars: paused
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor("white"))
        w, h = d * 0.14, d * 0.46
        for dx in (-w * 1.2, w * 0.2):
            p.drawRect(QRectF(r.center().x() + dx, r.center().y() - h / 2, w, h))
    p.end()
    return QIcon(pm)
