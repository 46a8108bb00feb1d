"""The main window, a package per part of it:

- mainwindow.py: MainWindow, the models list, the message banner, loads, the endpoint toggle;
- rows.py: the models table's rows (a model, a pending load, a watched folder's offer);
- vrambar.py: the stacked VRAM bar and its legend;
- chat.py: the Chat tab; dialogs.py: Preferences, a model's options, About;
- status_text.py and style.py: what it says about the device and the arena, its style sheet.
"""
from .mainwindow import MainWindow
from .status_text import arena_text, is_software_renderer

__all__ = ["MainWindow", "arena_text", "is_software_renderer"]
