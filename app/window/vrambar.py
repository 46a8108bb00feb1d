"""A stacked bar of device bytes by kind, drawn against the VRAM budget."""
from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

KINDS = ("weights", "kv", "recurrent", "compute", "vision", "scratch")
KIND_LABELS = {"weights": "Weights", "kv": "KV cache", "recurrent": "Recurrent",
               "compute": "Compute", "vision": "Vision", "scratch": "Scratch"}
KIND_COLORS = {"weights": QColor("#3f6fb5"), "kv": QColor("#e8833a"),
               "recurrent": QColor("#2a9d8f"), "compute": QColor("#6a9f3a"),
               "vision": QColor("#c9a227"), "scratch": QColor("#9b6bb0")}
TRACK = QColor("#eceff3")
TRACK_EDGE = QColor("#b9c0cb")
COLD_OUTLINE = QColor("#7a8494")


def format_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            break
        n /= 1024
    if unit == "B":
        return f"{int(n)} B"
    return f"{n:.0f} {unit}" if n >= 100 else f"{n:.1f} {unit}"


class VramBar(QWidget):
    """Segments for weights, KV, recurrent, compute and scratch bytes, left to right, on a
    track whose full width is the budget. A cold model also shows, dashed, what making it
    warm would take."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.device_bytes: dict[str, int] = {}
        self.budget = 0
        self.warm_bytes = 0
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(12)

    def sizeHint(self) -> QSize:
        return QSize(260, 14)

    def minimumSizeHint(self) -> QSize:
        return QSize(60, 12)

    def set_data(self, device_bytes: dict[str, int], budget: int, warm_bytes: int = 0) -> None:
        self.device_bytes = {k: int(v) for k, v in device_bytes.items() if v}
        self.budget = int(budget)
        self.warm_bytes = int(warm_bytes)
        lines = [f"{KIND_LABELS.get(k, k)}: {format_bytes(self.device_bytes[k])}"
                 for k in self._kinds()]
        total = sum(self.device_bytes.values())
        lines.append(f"Total: {format_bytes(total)} of {format_bytes(self.budget)} budget")
        if self.warm_bytes and total < self.warm_bytes:
            lines.append(f"Warm it needs {format_bytes(self.warm_bytes)}")
        self.setToolTip("\n".join(lines))
        self.update()

    def _kinds(self) -> list[str]:
        return [k for k in KINDS if k in self.device_bytes] + \
               [k for k in self.device_bytes if k not in KINDS]

    def segments(self, width: float) -> list[tuple[str, float, float]]:
        """(kind, x, w) in pixels for a bar `width` wide; what paintEvent draws."""
        total = sum(self.device_bytes.values())
        scale = width / max(self.budget, total, 1)
        out, x = [], 0.0
        for k in self._kinds():
            w = max(self.device_bytes[k] * scale, 1.0)   # one pixel, so nothing hides
            out.append((k, x, w))
            x += w
        return out

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        radius = min(4.0, r.height() / 2)
        track = QPainterPath()
        track.addRoundedRect(r, radius, radius)
        p.fillPath(track, TRACK)
        p.save()
        p.setClipPath(track)
        for kind, x, w in self.segments(r.width()):
            p.fillRect(QRectF(r.left() + x, r.top(), w, r.height()),
                       KIND_COLORS.get(kind, QColor("#888888")))
        total = sum(self.device_bytes.values())
        if self.warm_bytes > total:
            scale = r.width() / max(self.budget, self.warm_bytes, 1)
            pen = QPen(COLD_OUTLINE, 1.0, Qt.PenStyle.DashLine)
            p.setPen(pen)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRect(QRectF(r.left() + 1, r.top() + 1,
                              max(self.warm_bytes * scale - 2, 1), r.height() - 2))
        p.restore()
        p.setPen(QPen(TRACK_EDGE, 1.0))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawPath(track)
        p.end()


def present_kinds(device_bytes: dict[str, int]) -> list[str]:
    """The kinds holding bytes, in the bars' order (unknown kinds last)."""
    return [k for k in KINDS if device_bytes.get(k)] + \
           [k for k in device_bytes if k not in KINDS and device_bytes[k]]


def breakdown_html(device_bytes: dict[str, int], values: bool = True) -> str:
    """A legend line for the kinds present: a colour square and the name (and bytes), then
    the total; "" when nothing is on the device."""
    kinds = present_kinds(device_bytes)
    parts = []
    for k in kinds:
        color = KIND_COLORS.get(k, QColor("#888888")).name()
        label = KIND_LABELS.get(k, k)
        size = f" {format_bytes(device_bytes[k])}" if values else ""
        parts.append(f"<span style='color:{color}'>&#9632;</span>&nbsp;{label}{size}")
    if values and kinds:
        parts.append(f"<b>= {format_bytes(sum(device_bytes[k] for k in kinds))}</b>")
    return "&nbsp;&nbsp; ".join(parts)
