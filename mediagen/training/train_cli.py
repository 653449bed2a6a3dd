"""``mediagen train CONFIG.yaml [key=value ...]``: train or fine-tune from a YAML config.

On several GPUs: ``accelerate launch --num_processes 2 -m mediagen.cli train CONFIG.yaml``.

Exit status: 0 when the run reached train.max_steps, or was already there (a resumed run at or past
train.max_steps trains nothing and says so); 3 when train.time_limit_minutes or a SIGTERM stopped it
early, with a checkpoint written (resumable: the same command with checkpoint.resume=latest goes on);
2 for a config or input error (one line naming the key, the value and where it came from).
"""

from __future__ import annotations

# "stopped early with a checkpoint, resumable": distinct from 0 (done) so scripts and schedulers can
# tell an unfinished run from a finished one, and from 1/2 (crash / bad config), which need a fix first
EXIT_STOPPED = 3


def register(subparsers) -> None:
    import argparse

    p = subparsers.add_parser("train", help="train or fine-tune a diffusion transformer from a YAML config",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="YAML file (see configs/)")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. optim.lr=3e-4 train.max_steps=100")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--export", metavar="STEP", help="do not train: write the pipeline of checkpoint STEP (or "
                   "'latest') of output_dir, with its EMA weights, to --to; the model is built from the run's "
                   "output_dir/config.yaml, what it trained")
    p.add_argument("--to", help="folder for --export (default: output_dir/pipeline-step-<STEP>)")
    p.set_defaults(func=run)


def run(args) -> int:
    from omegaconf import OmegaConf

    from .config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    if args.export is not None:
        from .export import export_checkpoint

        print(f"wrote {export_checkpoint(cfg, args.export, args.to)}")
        return 0
    if args.to is not None:
        raise ValueError("--to is only used with --export")
    from .trainer import train

    result = train(cfg)
    losses = result["losses"]
    if not losses:  # nothing to train: the trainer said why
        return 0
    last = max(losses)
    if not result["finished"]:
        print(f"stopped at step {last} of {cfg.train.max_steps}: loss {losses[last]:.4f}; checkpoint in "
              f"{cfg.output_dir}; exit status {EXIT_STOPPED} (resumable)")
        return EXIT_STOPPED
    print(f"trained to step {last}: loss {losses[last]:.4f}; outputs in {cfg.output_dir}")
    return 0
