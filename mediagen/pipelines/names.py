"""Names the command line and the app offer, in a module that imports nothing heavy (no torch, no
diffusers), so building the ``mediagen`` argument parser stays fast.

Attention names and MHLA options come from ``mediagen.models.attention_spec`` (re-exported here);
scheduler and runtime names are defined here, and ``mediagen.pipelines.schedulers`` /
``mediagen.pipelines.runtime`` apply them.
"""

from __future__ import annotations

from ..models.attention_spec import ATTENTION_CHOICES, LAYER_ATTENTIONS

__all__ = ["ATTENTION_CHOICES", "LAYER_ATTENTIONS", "SCHEDULERS", "FLOW_SCHEDULERS", "CHECKPOINT_LABELS", "RUNTIMES",
           "START_STEPS"]

SCHEDULERS = ("flow-euler", "flow-unipc", "ddim", "dpm-solver")
FLOW_SCHEDULERS = ("flow-euler", "flow-unipc")   # velocity-predicting models; the others predict noise
# how the denoising loop runs the transformer; ``mediagen.pipelines.runtime`` applies them
RUNTIMES = ("eager", "compile", "cuda-graphs")
# Sampling steps a text task starts with, in the app and in `mediagen generate`: where the shipped clip models'
# rates are measured. At 4 steps they draw the asked digit in 0.82-0.88 of clips and 0.47-0.67 of stills, at 8
# in 0.96 of clips (docs/RESULTS.md, text-to-video); a still is one frame of a clip with no vote over frames,
# so it starts at 16 (0.92-0.95 of stills against 0.89-0.91 at 8).
START_STEPS = {"text-to-video": 8, "text-to-image": 16}

# A shipped checkpoint folder is named <family>-<label>; the label is the attention's name except
# for patterns, whose names describe a layout rather than the model ("wan-mhla-h" ships as "hybrid").
_PATTERN_LABELS = {"wan-mhla-h": "hybrid"}
CHECKPOINT_LABELS = {name: _PATTERN_LABELS.get(name, name) for name in ATTENTION_CHOICES}
