"""Render resources/hotseat.svg to resources/hotseat-{16,32,64,128,256}.png.

    python packaging/render_icons.py

Uses QtSvg (in PySide6-Essentials); where it is missing, the painted icon of app/icons.py.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402

from app.icons import PNG_SIZES, painted_icon  # noqa: E402


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841
    res = os.path.join(ROOT, "resources")
    svg = os.path.join(res, "hotseat.svg")
    try:
        from PySide6.QtSvg import QSvgRenderer
        renderer = QSvgRenderer(svg)
        if not renderer.isValid():
            raise RuntimeError(f"{svg}: not a valid SVG")
    except ImportError:
        renderer = None
    for size in PNG_SIZES:
        out = os.path.join(res, f"hotseat-{size}.png")
        if renderer is None:
            painted_icon(size).save(out)
        else:
            img = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
            img.fill(Qt.GlobalColor.transparent)
            p = QPainter(img)
            p.setRenderHint(QPainter.RenderHint.Antialiasing)
            p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
            renderer.render(p)
            p.end()
            img.save(out)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
