"""Settings as JSON in the config dir: round trip, and bad files that fall back to defaults."""
from __future__ import annotations

import json
import os

import pytest

from app import settings
from app.settings import ModelEntry, Settings


def test_dir_follows_the_env_var(config_dir):
    assert settings.settings_path() == os.path.join(str(config_dir), "settings.json")


def test_default_dir_is_platformdirs(monkeypatch):
    import platformdirs

    monkeypatch.delenv("HOTSEAT_CONFIG_DIR")
    assert settings.config_dir() == platformdirs.user_config_dir("hotseat", appauthor=False)


def test_missing_file_is_defaults_without_warning():
    s, warning = settings.load()
    assert s == Settings() and warning is None
    assert s.full_release and s.budget_bytes is None and s.port == 8080
    assert s.flash_attn == "auto"


def test_round_trip():
    s = Settings(models=[ModelEntry("/m/a.gguf", "a", True),
                         ModelEntry("/m/b.gguf", "b", n_ctx=512, cpu_moe=2.5)],
                 port=9000, budget_mib=3072, release_mode="weights",
                 watched_folder="/m", endpoint=True, autostart=True, flash_attn="on",
                 idle_evict_min=15, api_key="k", lan=True, notifications=False,
                 window_geometry="AdnQ")
    settings.save(s)
    back, warning = settings.load()
    assert warning is None and back == s
    assert back.budget_bytes == 3072 << 20 and back.full_release is False
    raw = json.loads(open(settings.settings_path()).read())
    assert raw["models"][0] == {"path": "/m/a.gguf", "name": "a", "pinned": True, "n_ctx": 0,
                                "cpu_moe": 0.0}


def test_lan_needs_a_key_or_the_explicit_opt_in():
    assert Settings().host == "127.0.0.1"
    assert Settings(lan=True).host == "127.0.0.1"                 # no key: not on the LAN
    assert Settings(lan=True, api_key="secret").host == "0.0.0.0"
    assert Settings(lan=True, lan_without_key=True).host == "0.0.0.0"
    assert Settings(lan=False, lan_without_key=True).host == "127.0.0.1"


def test_bad_model_options_fall_back():
    s, bad = settings.from_dict({"models": [{"path": "/a.gguf", "n_ctx": -4, "cpu_moe": "x"}],
                                 "idle_evict_min": -1})
    assert s.models == [ModelEntry("/a.gguf", "a")] and bad == ["idle_evict_min"]


def test_save_leaves_no_temporary_files(config_dir):
    settings.save(Settings())
    settings.save(Settings(port=1))
    assert sorted(os.listdir(config_dir)) == ["settings.json"]


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", "\"a string\"", "{" * 5000])
def test_corrupt_file_gives_defaults_and_a_warning(config_dir, text):
    os.makedirs(config_dir)
    path = settings.settings_path()
    with open(path, "w") as f:
        f.write(text)
    s, warning = settings.load()
    assert s == Settings()
    assert "corrupt" in warning and "using defaults" in warning and "\n" not in warning
    assert open(path + ".bad").read() == text                   # kept for the user
    assert not os.path.exists(path)


def test_binary_garbage_gives_defaults(config_dir):
    os.makedirs(config_dir)
    with open(settings.settings_path(), "wb") as f:
        f.write(b"\xff\xfe\x00garbage")
    s, warning = settings.load()
    assert s == Settings() and warning


def test_bad_fields_fall_back_one_by_one(config_dir):
    os.makedirs(config_dir)
    with open(settings.settings_path(), "w") as f:
        json.dump({"port": "eighty", "budget_mib": -5, "release_mode": "sometimes",
                   "models": [{"path": "/m/a.gguf"}], "watched_folder": 3, "endpoint": 1,
                   "autostart": True, "flash_attn": True, "unknown_key": 1}, f)
    s, warning = settings.load()
    assert s.port == 8080 and s.budget_mib == 0 and s.release_mode == "full"
    assert s.flash_attn == "auto"
    assert s.models == [ModelEntry("/m/a.gguf", "a", False)]    # name from the file name
    assert s.autostart is True and s.watched_folder == "" and s.endpoint is False
    for key in ("port", "budget_mib", "release_mode", "watched_folder", "endpoint",
                "flash_attn"):
        assert key in warning


def test_bad_model_list_is_dropped(config_dir):
    os.makedirs(config_dir)
    with open(settings.settings_path(), "w") as f:
        json.dump({"models": [{"name": "no path"}], "port": 9000}, f)
    s, warning = settings.load()
    assert s.models == [] and s.port == 9000 and "models" in warning


def test_unreadable_file_gives_defaults(config_dir):
    os.makedirs(os.path.join(config_dir, "settings.json"))      # a directory: cannot be read
    s, warning = settings.load()
    assert s == Settings() and "could not be read" in warning
