"""`hotseat serve`: the command that loads models and serves them over HTTP. The engine
comes from the caller (cli.py passes engine.api.Engine): the server knows only the facade."""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..facade import EngineAPI

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def add_parser(subparsers, model_help: str) -> argparse.ArgumentParser:
    s = subparsers.add_parser("serve", help="serve the OpenAI API over HTTP")
    s.add_argument("--model", "-m", action="append", help=f"{model_help}; repeat to serve several")
    s.add_argument("--mmproj", action="append", metavar="FILE",
                   help="a vision projector (mmproj GGUF) for the --model of the same place; "
                        "repeat for the next ones")
    s.add_argument("--image-max-tokens", type=int, metavar="N",
                   help="an image's most soft tokens where the projector sizes images "
                        "(Qwen3.5; default 4096, as llama.cpp)")
    s.add_argument("--image-scale-pixels", type=int, metavar="N",
                   help="scale larger images down to N pixels before anything else "
                        "(default: $HOTSEAT_IMAGE_SCALE_PIXELS, else 16000000)")
    s.add_argument("--fetch-images", action="store_true",
                   help="fetch image_url parts that are http(s) URLs (off: only data URLs are "
                        "taken; the server then fetches nothing)")
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address (default {DEFAULT_HOST})")
    s.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    s.add_argument("--api-key", default=os.environ.get("HOTSEAT_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and /api "
                        "(default: $HOTSEAT_API_KEY)")
    s.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (scheme://host[:port]), or * "
                        "(repeatable); other web pages are refused")
    s.add_argument("--allow-host", action="append", metavar="NAME",
                   help="also answer requests addressed to the host NAME (repeatable); "
                        "127.0.0.1, localhost, [::1] and the --host name always are")
    s.add_argument("--insecure-no-key", action="store_true",
                   help="serve on a non-loopback --host without --api-key (anyone who can "
                        "reach the port can then load, unload and generate)")
    s.add_argument("--ctx", type=int, default=2048, help="context size (default 2048)")
    s.add_argument("--budget-mib", type=int, metavar="N",
                   help="VRAM budget for all models together, in MiB (default: the device's "
                        "memory less a margin)")
    s.add_argument("--host-budget-mib", type=int, metavar="N",
                   help="RAM for every model's host shadows together, in MiB; past it the "
                        "least recently used KV shadows move to disk (default: "
                        "$HOTSEAT_HOST_BUDGET_MIB, else half the available memory)")
    s.add_argument("--evict-kv", action="store_true",
                   help="full eviction (KV to host too) instead of weights-only")
    from ..args import add_arena_arguments, add_cpu_moe_argument
    add_cpu_moe_argument(s)
    add_arena_arguments(s, wake=True)
    return s


def is_loopback(host: str) -> bool:
    """Whether --host binds only this machine's loopback interface."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:                    # a name: it may resolve to any interface
        return False


def check_exposure(host: str, api_key: str | None, insecure_no_key: bool) -> str | None:
    """Refuse a network-facing server without a key; the warning to print, if any."""
    if is_loopback(host) or api_key:
        return None
    if not insecure_no_key:
        raise ValueError(f"--host {host} is reachable from other machines: give --api-key KEY "
                         "(or $HOTSEAT_API_KEY), or --insecure-no-key to serve without one")
    return (f"hotseat: warning: serving on {host} without an API key: anyone who can reach "
            "this port can load, unload and run models")


def cmd_serve(args, Engine: Callable[..., EngineAPI]) -> int:
    """Engine: what makes the engine (engine.api.Engine), called with its settings."""
    from ..args import arena_enabled
    from ..formats.bundled import resolve

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be between 0 and 65535, got {args.port}")
    for name in args.allow_host or ():
        if not name.strip() or "/" in name:
            raise ValueError(f"--allow-host takes a host name, got {name!r}")
    warning = check_exposure(args.host, args.api_key, args.insecure_no_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if args.ctx < 16:
        raise ValueError(f"--ctx must be at least 16, got {args.ctx}")
    if args.budget_mib is not None and args.budget_mib <= 0:
        raise ValueError(f"--budget-mib must be positive, got {args.budget_mib}")
    paths = [resolve(m) for m in (args.model or [None])]
    mmproj = list(args.mmproj or [])
    if len(mmproj) > len(paths):
        raise ValueError(f"{len(mmproj)} --mmproj for {len(paths)} models: each pairs with the "
                         "--model of the same place")
    mmproj += [None] * (len(paths) - len(mmproj))
    logging.basicConfig(level=logging.WARNING, format="hotseat: %(levelname)s: %(message)s")
    if args.host_budget_mib is not None and args.host_budget_mib < 0:
        raise ValueError(f"--host-budget-mib must not be negative, got {args.host_budget_mib}")
    budget = None if args.budget_mib is None else args.budget_mib << 20
    host = None if args.host_budget_mib is None else args.host_budget_mib << 20
    eng = Engine(n_ctx=args.ctx, budget_bytes=budget, full_release=args.evict_kv,
                 host_budget_bytes=host,
                 flash_attn=args.flash_attn, arena=arena_enabled(args),
                 wake_on_free=args.wake_on_free, arena_label="serve (starting)")
    try:
        if args.image_scale_pixels is not None:
            if args.image_scale_pixels < 1:
                raise ValueError(f"--image-scale-pixels must be at least 1, got "
                                 f"{args.image_scale_pixels}")
            os.environ["HOTSEAT_IMAGE_SCALE_PIXELS"] = str(args.image_scale_pixels)
        if args.image_max_tokens is not None and args.image_max_tokens < 1:
            raise ValueError(f"--image-max-tokens must be at least 1, got "
                             f"{args.image_max_tokens}")
        names = [eng.load(p, cpu_moe=args.cpu_moe, mmproj=v,
                          image_max_tokens=args.image_max_tokens)
                 for p, v in zip(paths, mmproj)]
        return asyncio.run(_serve(eng, names, args))
    finally:
        eng.close()


async def _serve(eng: EngineAPI, names: list[str], args) -> int:
    from .listen import listen        # aiohttp with it, only where a server starts

    try:
        listening = await listen(eng, names, host=args.host, port=args.port,
                                 api_key=args.api_key, cors_origins=args.cors_origin or (),
                                 allow_hosts=args.allow_host or (),
                                 fetch_images=args.fetch_images)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {why}") from None
    host = f"[{args.host}]" if ":" in args.host else args.host
    eng.set_arena_label(f"serve http://{host}:{listening.port}")
    print(f"hotseat serving {', '.join(names)} on http://{host}:{listening.port} "
          f"(device: {eng.device_name})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):   # not on this platform or thread
            pass
    try:
        await stop.wait()
    finally:
        await listening.stop()
    return 0
