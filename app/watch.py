"""The watched models folder: a watchdog Observer that offers each new .gguf file once.

    w = FolderWatcher()
    w.offered.connect(window.on_model_offered)
    w.set_folder("/models")          # "" stops watching

watchdog calls back on its own thread; the signal carries the path to the UI thread. A file
still being copied is offered when it appears; the user adds it when the copy is done.
"""
from __future__ import annotations

import os
import threading

from PySide6.QtCore import QObject, Signal

SUFFIX = ".gguf"


class FolderWatcher(QObject):
    #: (path): a new .gguf file appeared in the watched folder (created, or moved in)
    offered = Signal(str)
    #: (message): the folder cannot be watched
    error = Signal(str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.folder = ""
        self._observer = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def set_folder(self, folder: str) -> bool:
        """Watch folder (not recursive); False (and error) when it cannot be watched."""
        folder = os.path.abspath(os.path.expanduser(folder)) if folder else ""
        if folder == self.folder and (self._observer is not None or not folder):
            return True
        self.stop()
        self.folder = folder
        if not folder:
            return True
        if not os.path.isdir(folder):
            self.error.emit(f"Watched folder {folder} does not exist")
            return False
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_created(self, event):
                if not event.is_directory:
                    watcher._offer(event.src_path)

            def on_moved(self, event):
                if not event.is_directory:
                    watcher._offer(event.dest_path)

        with self._lock:                   # files there already are not new
            self._seen = {os.path.join(folder, f) for f in os.listdir(folder)}
        obs = Observer()
        obs.daemon = True
        try:
            obs.schedule(Handler(), folder, recursive=False)
            obs.start()
        except OSError as exc:
            self.error.emit(f"Cannot watch {folder}: {exc.strerror or exc}")
            return False
        self._observer = obs
        return True

    def _offer(self, path) -> None:
        path = os.fsdecode(path)
        if not path.lower().endswith(SUFFIX) or os.path.basename(path).startswith("."):
            return
        with self._lock:
            if path in self._seen:
                return
            self._seen.add(path)
        self.offered.emit(path)

    def stop(self) -> None:
        obs, self._observer = self._observer, None
        if obs is not None:
            obs.stop()
            obs.join(5)
