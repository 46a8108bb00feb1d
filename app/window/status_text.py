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
    if state == "waiting":
        pid = st.get("holder_pid")
        return "Waiting for the GPU" + (f" (another app, pid {pid}, has it)" if pid else "")
    return ""
