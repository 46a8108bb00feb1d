"""A recorder of the bridge's signals, for tests that wait on state rather than on one
emission: the bridge emits from its worker thread, so an emission queued before a test's
wait may arrive during it; `qtbot.waitUntil(lambda: rec.model("a")["state"] == "cold")`
does not care which emission brought the state."""
from __future__ import annotations

from PySide6.QtCore import QObject, Slot


class Recorder(QObject):
    def __init__(self, bridge, parent: QObject | None = None):
        super().__init__(parent)
        self.devices: list[str] = []
        self.models: list[list] = []
        self.vram: list[dict] = []
        self.progress: list[tuple] = []
        self.loaded: list[tuple] = []
        self.failed: list[tuple] = []
        self.errors: list[str] = []          # error's summaries
        self.error_details: list[str] = []   # and their details
        self.endpoint: list[tuple] = []
        self.generated: list[tuple] = []
        bridge.device_ready.connect(self.on_device_ready)
        bridge.models_changed.connect(self.on_models_changed)
        bridge.vram_changed.connect(self.on_vram_changed)
        bridge.load_progress.connect(self.on_load_progress)
        bridge.load_finished.connect(self.on_load_finished)
        bridge.load_failed.connect(self.on_load_failed)
        bridge.error.connect(self.on_error)
        bridge.endpoint_changed.connect(self.on_endpoint_changed)
        bridge.generated.connect(self.on_generated)

    def model(self, name: str) -> dict:
        """The model's latest status dict, or {} while it is not listed."""
        if not self.models:
            return {}
        return next((m for m in self.models[-1] if m["name"] == name), {})

    def names(self) -> list[str] | None:
        return None if not self.models else [m["name"] for m in self.models[-1]]

    @Slot(str)
    def on_device_ready(self, name: str) -> None:
        self.devices.append(name)

    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        self.models.append(models)

    @Slot(dict)
    def on_vram_changed(self, vram: dict) -> None:
        self.vram.append(vram)

    @Slot(str, "qlonglong", "qlonglong")
    def on_load_progress(self, path: str, done: int, total: int) -> None:
        self.progress.append((path, done, total))

    @Slot(str, str)
    def on_load_finished(self, path: str, name: str) -> None:
        self.loaded.append((path, name))

    @Slot(str, str, str)
    def on_load_failed(self, path: str, summary: str, details: str) -> None:
        self.failed.append((path, summary, details))

    @Slot(str, str)
    def on_error(self, summary: str, details: str) -> None:
        self.error_details.append(details)
        self.errors.append(summary)

    @Slot(bool, str)
    def on_endpoint_changed(self, running: bool, detail: str) -> None:
        self.endpoint.append((running, detail))

    @Slot(str, str)
    def on_generated(self, name: str, text: str) -> None:
        self.generated.append((name, text))


def until(qtbot, condition, timeout: int = 5000) -> None:
    """qtbot.waitUntil for a condition that returns any truthy value."""
    qtbot.waitUntil(lambda: bool(condition()), timeout=timeout)
