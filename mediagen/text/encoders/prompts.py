"""A small synthetic corpus of image/video prompts for calibrating and distilling text encoders
offline. Deterministic; ``split='train'`` and ``split='heldout'`` never share a sentence (held-out
sentences are those whose subject comes from a reserved list)."""

from __future__ import annotations

import random

SUBJECTS = ["a red fox", "an old lighthouse", "a bowl of ramen", "a cyclist", "two cats", "a glass robot",
            "a mountain village", "a sailing ship", "a violinist", "a desert caravan", "a city tram",
            "a hummingbird", "an astronaut", "a wooden cabin", "a koi pond", "a steam locomotive",
            "a child with a kite", "a dragon", "a bakery window", "a field of sunflowers"]
HELDOUT_SUBJECTS = ["a polar bear", "a jazz trio", "a paper lantern", "a vintage car", "a waterfall",
                    "a chess player"]
ACTIONS = ["standing", "running", "resting", "glowing softly", "covered in snow", "reflected in water",
           "seen from above", "in motion", "half hidden by fog", "surrounded by flowers"]
SETTINGS = ["in a misty forest", "on a busy street", "at the edge of a cliff", "inside a cathedral",
            "under a starry sky", "on a quiet beach", "in a neon-lit alley", "on a snowy plain",
            "in a sunlit kitchen", "beside a river"]
STYLES = ["a photograph", "an oil painting", "a watercolor", "a pencil sketch", "a 3d render",
          "a cinematic still", "an anime frame", "a macro shot"]
LIGHT = ["golden hour light", "soft overcast light", "dramatic rim light", "moonlight", "harsh noon sun",
         "candlelight", "studio lighting"]
EXTRAS = ["", ", highly detailed", ", shallow depth of field", ", wide angle", ", 35mm film grain",
          ", the camera slowly pans left", ", slow motion", ", 4k"]


def make_prompts(count: int, split: str = "train", seed: int = 0) -> list[str]:
    if split not in ("train", "heldout"):
        raise ValueError(f"split={split!r} is not allowed: use 'train' or 'heldout'")
    rng = random.Random(f"{split}-{seed}")
    subjects = SUBJECTS if split == "train" else HELDOUT_SUBJECTS
    out = []
    for _ in range(count):
        out.append(f"{rng.choice(STYLES)} of {rng.choice(subjects)} {rng.choice(ACTIONS)} "
                   f"{rng.choice(SETTINGS)}, {rng.choice(LIGHT)}{rng.choice(EXTRAS)}")
    return out
