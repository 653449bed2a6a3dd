"""YAML-configured training and fine-tuning on accelerate: ``mediagen train CONFIG.yaml``.

``load_config(path, overrides)`` -> a checked ``TrainConfig``; ``train(cfg)`` runs or resumes it.
"""

from .config import ConfigError, TrainConfig, load_config


def train(cfg, on_step_end=None):
    from .trainer import train as _train

    return _train(cfg, on_step_end=on_step_end)


__all__ = ["ConfigError", "TrainConfig", "load_config", "train"]
