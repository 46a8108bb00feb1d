"""`hotseat ps`, `load`, `unload`, `pin`, `unpin`, `evict`, `warm`: clients of a running
`hotseat serve`, over its /api routes.

    hotseat ps                           # the loaded models, warm or cold, the VRAM budget,
                                         # and every process of the GPU arena: holder,
                                         # waiting, cold, or yielded until when; and
                                         # why game mode gave the GPU up, while it does
    hotseat evict NAME --full            # KV to host memory too

The server's address comes from --url, else $HOTSEAT_URL, else http://127.0.0.1:8080; its
key from --api-key, else $HOTSEAT_API_KEY. Standard library only, so these commands start
fast. A server that is not there, or that refuses, is one line on stderr and exit status 2
(the error is a ValueError, which `hotseat`'s main reports that way).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 600              # a load, or a status waiting behind a long generation
MiB = 1 << 20


class ServerError(ValueError):
    """The server is not there, or answered with an error; the message is one line."""


# -- HTTP ----------------------------------------------------------------------------------

def _base(url: str | None) -> str:
    url = (url or os.environ.get("HOTSEAT_URL") or DEFAULT_URL).strip().rstrip("/")
    return url if "://" in url else "http://" + url


def call(args, method: str, path: str, body: Any = None) -> Any:
    """One request to the server at args.url; the parsed JSON answer."""
    base = _base(args.url)
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    key = args.api_key if args.api_key is not None else os.environ.get("HOTSEAT_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            text = resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise ServerError(_error_message(exc)) from None
    except (socket.timeout, TimeoutError):
        raise ServerError(f"the hotseat server at {base} did not answer in {TIMEOUT_S} s") \
            from None
    except urllib.error.URLError:
        raise ServerError(f"no hotseat server at {base} (start one with hotseat serve)") \
            from None
    except ConnectionError:                    # it went away while answering
        raise ServerError(f"the hotseat server at {base} closed the connection") from None
    except ValueError as exc:                  # a URL urllib cannot use
        raise ServerError(f"bad server URL {base!r}: {exc}") from None
    try:
        return json.loads(text)
    except ValueError:
        raise ServerError(f"{base} answered something other than JSON; is it a hotseat "
                          f"server?") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The server's own message for an HTTP error, on one line."""
    try:
        message = json.loads(exc.read().decode("utf-8"))["error"]["message"]
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        message = f"HTTP {exc.code} {exc.reason}"
    return " ".join(str(message).split())


def _path(name: str, op: str = "") -> str:
    return "/api/models/" + urllib.parse.quote(name, safe="") + (f"/{op}" if op else "")


# -- output --------------------------------------------------------------------------------

def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def format_ps(models: list[dict], vram: dict) -> str:
    """The table `hotseat ps` prints, and a line with the VRAM budget and its use."""
    rows = [("NAME", "ARCH", "STATE", "PINNED", "VRAM", "VISION", "HOST SHADOW", "RAM", "DISK",
             "CONTEXT")]
    for m in models:
        # a vision projector's part of VRAM (in VRAM too); "-" without one
        vision = _mib(m["device_bytes"].get("vision", 0)) if m.get("mmproj") else "-"
        rows.append((m["name"], m["arch"], m["state"], "yes" if m["pinned"] else "no",
                     _mib(sum(m["device_bytes"].values())), vision,
                     _mib(m["host_shadow_bytes"]), _mib(m["ram_bytes"]), _mib(m["disk_bytes"]),
                     str(m["n_ctx"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    line = (f"VRAM budget {_mib(vram['budget_bytes'])}: {_mib(vram['granted_bytes'])} granted, "
            f"{_mib(vram['allocated_bytes'])} allocated on {vram['device']}")
    if "driver_budget_bytes" in vram:
        line += (f" (driver: {_mib(vram['driver_usage_bytes'])} used of "
                 f"{_mib(vram['driver_budget_bytes'])})")
    game = vram.get("game_mode") or {}
    if game.get("watching"):
        line += f"; game mode keeps {_mib(game['margin_bytes'])} free for other programs"
    host = (f"host budget {_mib(vram['host_budget_bytes'])}: {_mib(vram['host_used_bytes'])} "
            f"of shadows in RAM, {_mib(vram['host_disk_bytes'])} on disk")
    return "\n".join(lines + [line, host]) + "\n"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def format_arena(arena: dict | None) -> str:
    """The GPU arena's part of `hotseat ps`: where this server stands, then one row per
    process of the arena."""
    if not arena or not arena.get("enabled", True):
        return "GPU arena: not joined (the server runs with --no-arena)\n"
    state, pid = arena["state"], arena["pid"]
    if state == "holder":
        head = f"this server (pid {pid}) holds the GPU"
    elif state == "yielded":
        head = (f"the GPU is yielded to other programs until {_clock(arena['until'])} "
                f"(by process {arena.get('yielded_by')})")
    elif state == "waiting":
        who = f"process {arena['holder_pid']}" if arena.get("holder_pid") else "another"
        head = f"this server (pid {pid}) waits for the GPU, held by {who}"
    else:
        who = f"process {arena['holder_pid']}" if arena.get("holder_pid") else "nobody"
        head = f"this server (pid {pid}) is cold; the GPU is held by {who}"
    rows = [("PID", "STATE", "UNTIL", "PROCESS")]
    for p in arena.get("processes", []):
        rows.append((str(p["pid"]), p["state"], _clock(p["until"]) if p.get("until") else "",
                     (p.get("label") or "?") + (" (this server)" if p.get("self") else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return f"GPU arena {arena.get('dir', '')}: {head}\n" + "\n".join(lines) + "\n"


def format_game(arena: dict | None) -> str:
    """Game mode's part of `hotseat ps`: why the server gave the GPU up, while it keeps off
    it ("" otherwise)."""
    rec = (arena or {}).get("gave_up")
    if not rec:
        return ""
    what = "gave the GPU up" if rec.get("kind") == "released" else "stays off the GPU"
    line = f"Game mode: {what} at {_clock(rec['t'])}: {rec['reason']}"
    checked = rec.get("checked")
    if checked:
        line += (f" (last request, for {checked['model']} at {_clock(checked['t'])}: "
                 f"{_mib(checked['free_bytes'])} free, {_mib(checked['need_bytes'])} needed)")
    return line + "\n"


def _residency(m: dict) -> str:
    host = f", experts in host memory {_mib(m['host_weight_bytes'])}" \
        if m.get("host_weight_bytes") else ""
    return (f"{m['state']}{', pinned' if m['pinned'] else ''}; "
            f"VRAM {_mib(m['device_bytes_total'])}, host shadow {_mib(m['host_shadow_bytes'])}"
            + host)


def _done(args, answer: dict, line: str) -> int:
    if args.json:
        _emit_json(answer)
    else:
        print(line, flush=True)
    return 0


# -- commands ------------------------------------------------------------------------------

def cmd_ps(args) -> int:
    answer = call(args, "GET", "/api/models")
    models, arena = answer["models"], answer.get("arena")
    vram = call(args, "GET", "/api/vram")
    if args.json:
        _emit_json({"models": models, "vram": vram, "arena": arena})
    else:
        sys.stdout.write(format_ps(models, vram) + format_arena(
            {"enabled": False} if arena is None else arena) + format_game(arena))
        sys.stdout.flush()
    return 0


def cmd_load(args) -> int:
    # a file here is named for the server, which may run elsewhere in the file system;
    # anything else (a bundled model's name) goes as given
    path = os.path.abspath(args.path) if os.path.exists(args.path) else args.path
    body = {"path": path} if args.name is None else {"path": path, "name": args.name}
    if args.cpu_moe:
        body["cpu_moe"] = args.cpu_moe
    if args.mmproj:
        body["mmproj"] = os.path.abspath(args.mmproj)
    m = call(args, "POST", "/api/models", body)
    return _done(args, m, f"loaded {m['name']} ({m['arch']}, context {m['n_ctx']}): "
                          + _residency(m))


def cmd_unload(args) -> int:
    answer = call(args, "DELETE", _path(args.name))
    return _done(args, answer, f"unloaded {answer['name']}")


def cmd_pin(args) -> int:
    m = call(args, "POST", _path(args.name, "pin"), {})
    return _done(args, m, f"pinned {m['name']}: " + _residency(m))


def cmd_unpin(args) -> int:
    m = call(args, "POST", _path(args.name, "unpin"), {})
    return _done(args, m, f"unpinned {m['name']}: " + _residency(m))


def cmd_evict(args) -> int:
    m = call(args, "POST", _path(args.name, "evict"), {"full": True} if args.full else {})
    t = m["transfer"]
    moved = f", {_mib(t['bytes'])} of KV copied to host" if t.get("bytes") else ""
    return _done(args, m, f"evicted {m['name']} in {t['seconds']:.2f} s{moved}: "
                          + _residency(m))


def cmd_warm(args) -> int:
    m = call(args, "POST", _path(args.name, "warm"), {})
    t = m["transfer"]
    how = f"restored {_mib(t['bytes'])} in {t['seconds']:.2f} s" if t.get("op") \
        else "already warm"
    return _done(args, m, f"warmed {m['name']} ({how}): " + _residency(m))


# -- parser --------------------------------------------------------------------------------

def add_parsers(subparsers) -> None:
    """The client commands, registered on `hotseat`'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"the server (default: $HOTSEAT_URL, else {DEFAULT_URL})")
    common.add_argument("--api-key", help="the server's API key (default: $HOTSEAT_API_KEY)")
    common.add_argument("--json", action="store_true", help="print the server's JSON answer")

    def add(cmd: str, help_: str, func, name: bool = True) -> argparse.ArgumentParser:
        p = subparsers.add_parser(cmd, help=help_, parents=[common])
        if name:
            p.add_argument("name", help="the model's name, as hotseat ps shows it")
        p.set_defaults(func=func)
        return p

    add("ps", "list the models of a running server: warm or cold, pinned, VRAM", cmd_ps,
        name=False)
    ld = add("load", "load a model into a running server", cmd_load, name=False)
    ld.add_argument("path", help="a GGUF file, or a bundled model (smollm2, gemma3)")
    ld.add_argument("--name", help="the name to serve it under (default: the file's name)")
    ld.add_argument("--mmproj", metavar="FILE", help="its vision projector (mmproj GGUF)")
    from ..args import add_cpu_moe_argument
    add_cpu_moe_argument(ld)
    add("unload", "unload a model from a running server", cmd_unload)
    add("pin", "keep a model warm: make it warm now and never evict it", cmd_pin)
    add("unpin", "let the server evict a model again when another needs the room", cmd_unpin)
    ev = add("evict", "make a model cold now (weights released)", cmd_evict)
    ev.add_argument("--full", action="store_true",
                    help="release the KV too, keeping it in host memory (default: the "
                         "server's mode)")
    add("warm", "make a model warm now (the server evicts others if the budget needs it)",
        cmd_warm)
