"""``mediagen train CONFIG.yaml [key=value ...]``: train or fine-tune from a YAML config.

On several GPUs: ``accelerate launch --num_processes 2 -m mediagen.cli train CONFIG.yaml``.
"""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train or fine-tune a diffusion transformer from a YAML config",
                              description=__doc__)
    p.add_argument("config", help="YAML file (see configs/)")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. optim.lr=3e-4 train.max_steps=100")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--export", metavar="STEP", help="do not train: write the pipeline of checkpoint STEP (or "
                   "'latest') of output_dir, with its EMA weights, to --to")
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
    if losses:
        last = max(losses)
        print(f"trained to step {last}: loss {losses[last]:.4f}; outputs in {cfg.output_dir}")
    return 0
