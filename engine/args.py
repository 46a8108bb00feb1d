"""Command-line options that several front ends share: `hotseat` itself, `hotseat serve` and
the clients of a running server (tools/client.py). Below all three, so none imports another
for them."""
from __future__ import annotations

import argparse


def add_cpu_moe_argument(p: argparse.ArgumentParser) -> None:
    # the engine checks the value against the model (PlacementError, one line, status 2)
    p.add_argument("--cpu-moe", type=float, default=0.0, metavar="N.F",
                   help="mixture-of-experts models: keep the expert tensors of the first N "
                        "layers in host memory, read by the GPU in place (less VRAM, slower); "
                        "a fraction also takes part of layer N's, gate first, then up "
                        "(default 0: all on the device)")


def add_flash_attn_argument(p: argparse.ArgumentParser) -> None:
    """--flash-attn on a command that loads models."""
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default=None,
                   help="tiled attention for prompts: auto (on AMD GCN GPUs with heads of 256 "
                        "and more), on or off (default: $HOTSEAT_FLASH_ATTN, else auto)")


NO_ARENA_ENV = "HOTSEAT_NO_ARENA"


def add_arena_arguments(p: argparse.ArgumentParser, wake: bool = False) -> None:
    """--no-arena on a command that loads models; with wake (serve) also --wake-on-free."""
    p.add_argument("--no-arena", action="store_true",
                   help="do not take turns on the GPU with the user's other Hotseat processes "
                        f"(the arena); also ${NO_ARENA_ENV}=1")
    if wake:
        p.add_argument("--wake-on-free", action="store_true",
                       help="after another process took the GPU, take it back as soon as it "
                            "is free and restore the models, not only at the next request")


def arena_enabled(args: argparse.Namespace | None = None) -> bool:
    """Whether a front end joins the arena: yes unless --no-arena or $HOTSEAT_NO_ARENA."""
    import os

    if args is not None and getattr(args, "no_arena", False):
        return False
    return os.environ.get(NO_ARENA_ENV, "").strip().lower() in ("", "0", "no", "false")
