"""The watched models folder: new .gguf files are offered once, into the window."""
from __future__ import annotations

import os
import shutil

import pytest
from PySide6.QtCore import QObject, Slot

from app.watch import FolderWatcher
from tests.helpers.fake_engine import write_gguf
from tests.helpers.signals import until


class Offers(QObject):
    def __init__(self, watcher: FolderWatcher):
        super().__init__()
        self.paths: list[str] = []
        self.errors: list[str] = []
        watcher.offered.connect(self.on_offered)
        watcher.error.connect(self.on_error)

    @Slot(str)
    def on_offered(self, path: str) -> None:
        self.paths.append(path)

    @Slot(str)
    def on_error(self, message: str) -> None:
        self.errors.append(message)


@pytest.fixture
def watcher(qtbot):
    w = FolderWatcher()
    yield w
    w.stop()


def test_new_gguf_files_are_offered_once(qtbot, watcher, tmp_path):
    folder = tmp_path / "watched"
    folder.mkdir()
    write_gguf(folder / "old.gguf")                             # there before: not new
    offers = Offers(watcher)
    assert watcher.set_folder(str(folder))
    (folder / "notes.txt").write_text("not a model")
    write_gguf(folder / "new.gguf")
    until(qtbot, lambda: offers.paths)
    qtbot.wait(200)
    assert offers.paths == [str(folder / "new.gguf")]


def test_a_file_moved_in_is_offered(qtbot, watcher, tmp_path):
    folder = tmp_path / "watched"
    folder.mkdir()
    offers = Offers(watcher)
    watcher.set_folder(str(folder))
    src = write_gguf(tmp_path / "elsewhere.gguf")
    shutil.move(src, folder / "moved.gguf")
    until(qtbot, lambda: offers.paths)
    assert offers.paths == [str(folder / "moved.gguf")]


def test_a_missing_folder_is_an_error(qtbot, watcher, tmp_path):
    offers = Offers(watcher)
    assert not watcher.set_folder(str(tmp_path / "nope"))
    until(qtbot, lambda: offers.errors)
    assert "does not exist" in offers.errors[0]


def test_clearing_the_folder_stops_watching(qtbot, watcher, tmp_path):
    offers = Offers(watcher)
    watcher.set_folder(str(tmp_path))
    assert watcher.set_folder("") and watcher.folder == ""
    write_gguf(tmp_path / "late.gguf")
    qtbot.wait(200)
    assert offers.paths == []


def test_offer_reaches_the_window_and_adds(qtbot, bridge, tmp_path):
    from app.window import MainWindow

    folder = tmp_path / "watched"
    folder.mkdir()
    window = MainWindow(bridge)
    qtbot.addWidget(window)
    w = FolderWatcher()
    try:
        w.offered.connect(window.on_model_offered)
        w.set_folder(str(folder))
        path = write_gguf(folder / "fresh.gguf")
        until(qtbot, lambda: path in window.offers)
        window.offers[path].add_button.click()
        until(qtbot, lambda: "fresh" in window.rows)
        assert os.path.basename(window.rows["fresh"].status["path"]) == "fresh.gguf"
    finally:
        w.stop()
        window.timer.stop()
