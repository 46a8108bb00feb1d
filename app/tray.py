"""The tray icon and its menu: the models with their state, the endpoint toggle, yielding
the GPU, the window, quit. The menu is built whether or not a system tray exists, so it can
be shown (and tested) as a plain widget; the icon is created only where
`isSystemTrayAvailable()`. The icon shows the state: idle, busy (a load, a warm),
generating, yielded to another app (by a yield, or by game mode giving the GPU up)."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from .bridge import YIELD_S, EngineBridge
from .icons import state_icon
from .window import arena_text

STATE_MARK = {"warm": "●", "cold": "○"}


def model_title(status: dict) -> str:
    """"● name — warm, pinned" for the menu."""
    state = status.get("state", "cold")
    extra = ", pinned" if status.get("pinned") else ""
    return f"{STATE_MARK.get(state, '○')}  {status['name']} — {state}{extra}"


class Tray(QObject):
    #: the user asked for the window
    show_window_requested = Signal()
    #: the user chose Quit
    quit_requested = Signal()
    #: the user asked for Preferences
    preferences_requested = Signal()

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None,
                 use_system_tray: bool | None = None):
        super().__init__(parent)
        self.bridge = bridge
        self.models: list[dict] = []
        self.endpoint_url = ""
        self.device = bridge.device_name
        self.menu = QMenu()
        self.menu.setObjectName("trayMenu")
        self.header = QAction("Hotseat", self)
        self.header.setEnabled(False)
        self.endpoint_action = QAction("Local endpoint", self, checkable=True)
        self.endpoint_action.toggled.connect(self.on_endpoint_toggled)
        self.arena_action = QAction("", self)
        self.arena_action.setEnabled(False)
        self.yield_action = QAction(f"Yield the GPU for {YIELD_S // 60} minutes", self)
        self.yield_action.setToolTip("Every Hotseat goes cold and stays off the GPU (a game "
                                     "wants it)")
        self.yield_action.triggered.connect(self.on_yield_triggered)
        self.open_action = QAction("Open Hotseat", self)
        self.open_action.triggered.connect(self.show_window_requested)
        self.prefs_action = QAction("Preferences…", self)
        self.prefs_action.triggered.connect(self.preferences_requested)
        self.quit_action = QAction("Quit", self)
        self.quit_action.triggered.connect(self.quit_requested)
        self.model_menus: dict[str, QMenu] = {}
        self.icon: QSystemTrayIcon | None = None
        self.busy: dict[str, str] = {}
        self.arena: dict = {}
        self.state = "idle"
        self.notifications: list[tuple[str, str]] = []   # what notify() showed
        self._rebuild()

        if use_system_tray is None:
            use_system_tray = QSystemTrayIcon.isSystemTrayAvailable()
        if use_system_tray:
            self.icon = QSystemTrayIcon(state_icon("idle"), self)
            self.icon.setContextMenu(self.menu)
            self.icon.setToolTip("Hotseat")
            self.icon.activated.connect(self.on_activated)
            self.icon.show()

        bridge.models_changed.connect(self.on_models_changed)
        bridge.endpoint_changed.connect(self.on_endpoint_changed)
        bridge.device_ready.connect(self.on_device_ready)
        bridge.busy_changed.connect(self.on_busy_changed)
        bridge.arena_changed.connect(self.on_arena_changed)

    @property
    def available(self) -> bool:
        return self.icon is not None

    def _rebuild(self) -> None:
        # clear() deletes the actions the menu owns (the model entries); the fixed ones
        # belong to this object and are added back
        self.menu.clear()
        for m in self.model_menus.values():
            m.deleteLater()
        self.model_menus = {}
        self.header.setText(f"Hotseat — {self.device}" if self.device else "Hotseat")
        self.menu.addAction(self.header)
        text = arena_text(self.arena)
        if text:
            self.arena_action.setText(text)
            self.menu.addAction(self.arena_action)
        self.menu.addSeparator()
        if not self.models:
            none = self.menu.addAction("No models loaded")
            none.setEnabled(False)
        for s in self.models:
            sub = self.menu.addMenu(model_title(s))
            sub.setObjectName(f"model:{s['name']}")
            pin = sub.addAction("Pinned")
            pin.setCheckable(True)
            pin.setChecked(bool(s.get("pinned")))
            pin.toggled.connect(lambda on, n=s["name"]: self.bridge.set_pinned(n, on))
            evict = sub.addAction("Evict")
            evict.setEnabled(s.get("state") == "warm" and not s.get("pinned"))
            evict.triggered.connect(lambda _=False, n=s["name"]: self.bridge.evict(n))
            warm = sub.addAction("Make warm")
            warm.setEnabled(s.get("state") != "warm")
            warm.triggered.connect(lambda _=False, n=s["name"]: self.bridge.warm(n))
            unload = sub.addAction("Unload")
            unload.triggered.connect(lambda _=False, n=s["name"]: self.bridge.unload(n))
            self.model_menus[s["name"]] = sub
        self.menu.addSeparator()
        self.endpoint_action.setText(f"Local endpoint ({self.endpoint_url})"
                                     if self.endpoint_url else "Local endpoint")
        self.menu.addAction(self.endpoint_action)
        self.menu.addAction(self.yield_action)
        self.menu.addSeparator()
        self.menu.addAction(self.open_action)
        self.menu.addAction(self.prefs_action)
        self.menu.addSeparator()
        self.menu.addAction(self.quit_action)
        self._update_icon()

    def _update_icon(self) -> None:
        if self.arena.get("state") == "yielded" or self.arena.get("gave_up"):
            state = "yielded"
        elif any(t.startswith("generating") for t in self.busy.values()):
            state = "generating"
        elif self.busy:
            state = "busy"
        else:
            state = "idle"
        changed = state != self.state
        self.state = state
        if self.icon is None:
            return
        if changed:
            self.icon.setIcon(state_icon(state))
        warm = sum(1 for s in self.models if s.get("state") == "warm")
        tip = f"Hotseat: {len(self.models)} models, {warm} warm"
        extra = arena_text(self.arena) or "; ".join(f"{n}: {t}" for n, t in self.busy.items())
        self.icon.setToolTip(tip + (f"\n{extra}" if extra else ""))

    def notify(self, title: str, text: str) -> None:
        """A desktop notification from the tray icon (recorded where there is none)."""
        self.notifications.append((title, text))
        if self.icon is not None and self.icon.supportsMessages():
            self.icon.showMessage(title, text, state_icon(self.state), 5000)

    def texts(self) -> list[str]:
        """The menu's entries as shown ("" for a separator)."""
        return [a.text() for a in self.menu.actions()]

    @Slot(list)
    def on_models_changed(self, models: list) -> None:
        key = [(s["name"], s.get("state"), bool(s.get("pinned"))) for s in models]
        if key == [(s["name"], s.get("state"), bool(s.get("pinned"))) for s in self.models]:
            return                              # the 1 s refresh: keep an open menu as it is
        self.models = [dict(s) for s in models]
        self._rebuild()

    @Slot(dict)
    def on_busy_changed(self, busy: dict) -> None:
        self.busy = dict(busy)
        self._update_icon()

    @Slot(dict)
    def on_arena_changed(self, st: dict) -> None:
        self.arena = dict(st)
        self._rebuild()

    @Slot()
    def on_yield_triggered(self) -> None:
        self.bridge.yield_gpu(YIELD_S)

    @Slot(str)
    def on_device_ready(self, name: str) -> None:
        self.device = name
        self.header.setText(f"Hotseat — {name}")

    @Slot(bool)
    def on_endpoint_toggled(self, enabled: bool) -> None:
        self.bridge.set_endpoint(enabled)

    @Slot(bool, str)
    def on_endpoint_changed(self, running: bool, detail: str) -> None:
        self.endpoint_url = detail if running else ""
        self.endpoint_action.blockSignals(True)
        self.endpoint_action.setChecked(running)
        self.endpoint_action.blockSignals(False)
        self.endpoint_action.setText(f"Local endpoint ({detail})" if running
                                     else "Local endpoint")

    @Slot(QSystemTrayIcon.ActivationReason)
    def on_activated(self, reason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger,
                      QSystemTrayIcon.ActivationReason.DoubleClick):
            self.show_window_requested.emit()

    def close(self) -> None:
        if self.icon is not None:
            self.icon.hide()
        self.menu.deleteLater()
