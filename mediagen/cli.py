"""The ``mediagen`` console script. Each subcommand lives in its own module, which defines
``register(subparsers)`` (adds its parser, sets ``func``); modules are listed in COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module that registers it
COMMANDS = {
    "bench": "mediagen.eval.bench_cli",
    "fid": "mediagen.eval.fid_cli",
    "vbench": "mediagen.eval.vbench_cli",
    "attention-stats": "mediagen.eval.attention_stats_cli",
    "generate": "mediagen.pipelines.generate_cli",
    "train": "mediagen.training.train_cli",
    "app": "mediagen.app.app_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mediagen", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.description = "Image and video diffusion on MHLA: generate, train, evaluate, benchmark."
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv=None) -> int:
    from .host_memory import keep_freed_memory

    keep_freed_memory()  # CPU steps reuse their freed temporaries instead of faulting fresh pages in
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except ValueError as err:  # bad input: a readable message, not a stack trace
        print(f"mediagen {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
