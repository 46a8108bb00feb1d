"""What the window and the tray say about the device and the arena."""
from __future__ import annotations

import time

SOFTWARE_RENDERERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe")
SOFTWARE_WARNING = "No GPU found: running on the CPU, slow"


def is_software_renderer(device: str) -> bool:
    d = device.lower()
    return any(s in d for s in SOFTWARE_RENDERERS)


def arena_text(st: dict) -> str:
    """What the window and the tray say about the arena; "" when there is nothing to say."""
    state = st.get("state")
    if state == "yielded":
        until = st.get("until")
        if until:
            return f"Yielded to another app until {time.strftime('%H:%M', time.localtime(until))}"
        return "Yielded to another app"
    gave_up = st.get("gave_up")
    if gave_up:
        return (f"Gave the GPU up to another app at "
                f"{time.strftime('%H:%M', time.localtime(gave_up['t']))} "
                f"({_size(gave_up['free_bytes'])} of VRAM was free); back once it is free")
    if state == "waiting":
        pid = st.get("holder_pid")
        return "Waiting for the GPU" + (f" (another app, pid {pid}, has it)" if pid else "")
    return ""


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"
