"""Names the command line and the app offer, in a module that imports nothing heavy (no torch, no
diffusers), so building the ``mediagen`` argument parser stays fast.

Attention names and MHLA options come from ``mediagen.models.attention_spec`` (re-exported here);
scheduler and runtime names are defined here, and ``mediagen.pipelines.schedulers`` /
``mediagen.pipelines.runtime`` apply them.
"""

from __future__ import annotations

from ..models.attention_spec import ATTENTION_CHOICES, LAYER_ATTENTIONS

__all__ = ["ATTENTION_CHOICES", "LAYER_ATTENTIONS", "SCHEDULERS", "FLOW_SCHEDULERS", "CHECKPOINT_LABELS", "RUNTIMES"]

SCHEDULERS = ("flow-euler", "flow-unipc", "ddim", "dpm-solver")
FLOW_SCHEDULERS = ("flow-euler", "flow-unipc")   # velocity-predicting models; the others predict noise
# how the denoising loop runs the transformer; ``mediagen.pipelines.runtime`` applies them
RUNTIMES = ("eager", "compile", "cuda-graphs")

# A shipped checkpoint folder is named <family>-<label>; the label is the attention's name except
# for patterns, whose names describe a layout rather than the model ("wan-mhla-h" ships as "hybrid").
_PATTERN_LABELS = {"wan-mhla-h": "hybrid"}
CHECKPOINT_LABELS = {name: _PATTERN_LABELS.get(name, name) for name in ATTENTION_CHOICES}
