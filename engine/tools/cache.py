"""`hotseat cache`: the prompt caches kept across restarts (engine/residency/promptcache.py).

    hotseat cache ls          # each model's saved prompt cache: tokens, size, last use
    hotseat cache clear       # remove them all
"""
from __future__ import annotations

import json
import time

from ..residency import promptcache


def add_parser(sub) -> None:
    c = sub.add_parser("cache", help="list or clear the prompt caches kept across restarts")
    c.add_argument("action", choices=["ls", "clear"])
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cache)


def cmd_cache(args) -> int:
    folder = promptcache.cache_dir()
    if args.action == "clear":
        n = promptcache.clear()
        print(json.dumps({"removed": n, "folder": str(folder)}) if args.json
              else f"removed {n} prompt cache{'' if n == 1 else 's'} from {folder}")
        return 0
    entries = promptcache.entries()
    if args.json:
        print(json.dumps({"folder": str(folder), "limit_bytes": promptcache.limit_bytes(),
                          "entries": entries}, indent=1))
        return 0
    total = sum(e["bytes"] for e in entries)
    print(f"{folder}: {len(entries)} prompt cache{'' if len(entries) == 1 else 's'}, "
          f"{total / 2**20:.1f} of {promptcache.limit_bytes() / 2**20:.0f} MiB")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["used"]))
        tokens = "?" if e["tokens"] is None else e["tokens"]
        print(f"  {e['model'] or '(unreadable)':24s} {tokens:>6} tokens {e['bytes'] / 2**20:8.1f} "
              f"MiB  used {when}  {e['path'] or e['file']}")
    return 0
