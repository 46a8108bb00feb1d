"""The tray app's settings: one JSON file in the user config dir ("hotseat").

    s, warning = load()            # defaults (and a one-line warning) when the file is bad
    s.port = 8081
    save(s)

`HOTSEAT_CONFIG_DIR` overrides the directory. A file that cannot be parsed is kept beside
the new one as `settings.json.bad` and never crashes the app; a field of the wrong type
falls back to its default, with a warning naming it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

FILE_NAME = "settings.json"
RELEASE_MODES = ("full", "weights")     # engine full_release=True / False
FLASH_ATTN_MODES = ("auto", "on", "off")  # engine flash_attn
DEFAULT_PORT = 8080
HOST = "127.0.0.1"
MAX_IDLE_MIN = 24 * 60


@dataclass
class ModelEntry:
    path: str
    name: str
    pinned: bool = False
    n_ctx: int = 0                       # 0: the engine's default context size
    cpu_moe: float = 0.0                 # expert layers kept in host memory (Engine.load)


@dataclass
class Settings:
    models: list[ModelEntry] = field(default_factory=list)   # reloaded at start, in order
    port: int = DEFAULT_PORT
    budget_mib: int = 0                  # 0: the engine's default (device heap less a margin)
    host_budget_mib: int = 0             # RAM for the models' shadows; 0: the engine's default
    release_mode: str = "full"           # "full": weights, KV and compute; "weights": weights only
    watched_folder: str = ""             # "" : no folder watched
    endpoint: bool = False               # start the local endpoint at start-up
    autostart: bool = False              # start at login (XDG autostart entry)
    flash_attn: str = "auto"             # prompt attention: "auto" (engine decides), "on", "off"
    idle_evict_min: int = 0              # evict a warm, unpinned model unused this long; 0: never
    api_key: str = ""                    # the endpoint's key ("" : none)
    lan: bool = False                    # listen on every address, not only 127.0.0.1
    lan_without_key: bool = False        # the explicit, warned opt-in to LAN with no key
    notifications: bool = True           # tray notifications while the window is hidden
    window_geometry: str = ""            # QWidget.saveGeometry(), base64

    @property
    def host(self) -> str:
        """Where the endpoint listens: the LAN only with a key or the explicit opt-in."""
        return "0.0.0.0" if self.lan and (self.api_key or self.lan_without_key) else HOST

    @property
    def full_release(self) -> bool:
        return self.release_mode != "weights"

    @property
    def budget_bytes(self) -> int | None:
        return self.budget_mib << 20 if self.budget_mib > 0 else None

    @property
    def host_budget_bytes(self) -> int | None:
        return self.host_budget_mib << 20 if self.host_budget_mib > 0 else None

    def as_dict(self) -> dict:
        return asdict(self)


def config_dir() -> str:
    env = os.environ.get("HOTSEAT_CONFIG_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_config_dir("hotseat", appauthor=False)


def settings_path() -> str:
    return os.path.join(config_dir(), FILE_NAME)


def _valid(name: str, value) -> bool:
    if name == "port":
        return type(value) is int and 0 <= value <= 65535
    if name in ("budget_mib", "host_budget_mib"):
        return type(value) is int and value >= 0
    if name == "release_mode":
        return value in RELEASE_MODES
    if name == "flash_attn":
        return value in FLASH_ATTN_MODES
    if name == "idle_evict_min":
        return type(value) is int and 0 <= value <= MAX_IDLE_MIN
    if name in ("watched_folder", "api_key", "window_geometry"):
        return isinstance(value, str)
    if name in ("endpoint", "autostart", "lan", "lan_without_key", "notifications"):
        return isinstance(value, bool)
    return False


def _models(raw) -> list[ModelEntry] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if not (isinstance(item, dict) and isinstance(item.get("path"), str) and item["path"]):
            return None
        name = item.get("name")
        if not isinstance(name, str) or not name:
            name = os.path.splitext(os.path.basename(item["path"]))[0]
        n_ctx, cpu_moe = item.get("n_ctx", 0), item.get("cpu_moe", 0.0)
        if type(n_ctx) is not int or n_ctx < 0:
            n_ctx = 0
        if type(cpu_moe) not in (int, float) or not 0 <= cpu_moe < 1e4:
            cpu_moe = 0.0
        out.append(ModelEntry(item["path"], name, bool(item.get("pinned", False)), n_ctx,
                              float(cpu_moe)))
    return out


def from_dict(raw: dict) -> tuple[Settings, list[str]]:
    """Settings from parsed JSON, and the names of fields that were bad and so defaulted."""
    s = Settings()
    bad = []
    for f in fields(Settings):
        if f.name not in raw:
            continue
        value = raw[f.name]
        if f.name == "models":
            models = _models(value)
            if models is None:
                bad.append(f.name)
            else:
                s.models = models
        elif _valid(f.name, value):
            setattr(s, f.name, value)
        else:
            bad.append(f.name)
    return s, bad


def load(path: str | None = None) -> tuple[Settings, str | None]:
    """The saved settings, or defaults; the second item is a warning for the user, or None."""
    path = path or settings_path()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return Settings(), None
    except (OSError, UnicodeDecodeError) as exc:
        return Settings(), f"Settings could not be read ({path}: {exc}); using defaults."
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as exc:
        _keep_bad(path)
        return Settings(), (f"Settings file {path} is corrupt ({exc}); using defaults "
                            f"(the old file is kept as {os.path.basename(path)}.bad).")
    s, bad = from_dict(raw)
    if bad:
        return s, f"Settings file {path}: bad value for {', '.join(bad)}; using the default."
    return s, None


def _keep_bad(path: str) -> None:
    try:
        os.replace(path, path + ".bad")
    except OSError:
        pass


def save(s: Settings, path: str | None = None) -> None:
    """Write atomically: a crash mid-write leaves the old file, never half a new one."""
    path = path or settings_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(s.as_dict(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
