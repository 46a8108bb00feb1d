"""`hotseat yield`: every Hotseat process leaves the GPU for a while (a game wants it).

    hotseat yield --for 600      # every server and the tray go cold and stay cold 600 s
    hotseat yield --cancel       # the yield ends now; waiting requests go on
"""
from __future__ import annotations

import time

from ..residency.arena import MAX_YIELD_S, Arena, ArenaError


def add_parser(sub) -> None:
    y = sub.add_parser("yield", help="make every Hotseat process leave the GPU for a while")
    y.add_argument("--for", dest="seconds", type=float, default=60.0, metavar="SECONDS",
                   help="how long Hotseat stays off the GPU (default 60)")
    y.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for the holder to go cold (default 30)")
    y.add_argument("--cancel", action="store_true",
                   help="end a yield in force now, so that Hotseat uses the GPU again")
    y.set_defaults(func=cmd_yield)


def cmd_yield(args) -> int:
    import sys

    if args.cancel:
        try:
            with Arena(watch=False) as arena:
                until = arena.cancel_yield()
        except ArenaError as exc:
            print(f"hotseat: error: {exc}", file=sys.stderr)
            return 2
        print(f"The yield until {time.strftime('%H:%M:%S', time.localtime(until))} is over; "
              f"Hotseat processes may use the GPU again." if until is not None
              else "No yield was in force.")
        return 0
    if not 0 < args.seconds <= MAX_YIELD_S:
        print(f"hotseat: error: --for takes more than 0 and at most {MAX_YIELD_S} seconds, "
              f"got {args.seconds:g}", file=sys.stderr)
        return 2
    try:
        with Arena(watch=False) as arena:
            done = arena.yield_gpu(args.seconds, wait=max(0.0, args.wait))
    except ArenaError as exc:
        print(f"hotseat: error: {exc}", file=sys.stderr)
        return 2
    back = (f"Hotseat processes stay off it until "
            f"{time.strftime('%H:%M:%S', time.localtime(done['until']))} "
            f"({args.seconds:g} s from now)")
    h = done["holder"]
    who = f"process {h['pid']} ({h.get('reason') or 'idle'})" if h else None
    if not done["free"]:
        print(f"hotseat: {who or 'a Hotseat process'} still holds the GPU after "
              f"{args.wait:g} s (a request in progress); it goes cold when that request "
              f"ends. {back}.", file=sys.stderr)
        return 1
    print(f"{who} went cold and left the GPU in {done['seconds']:.2f} s; {back}." if who
          else f"No Hotseat process held the GPU; {back}.")
    return 0
