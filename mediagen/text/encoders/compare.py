"""How close each named text encoder's sentence embedding is to MiniLM's: the cosine similarity of the
mean-pooled, l2-normalised last hidden states (MiniLM's sentence embedding), per sentence, on two sets:

  varied      everyday English sentences of many shapes (questions, lists, numbers, long and short),
              unlike the image-prompt corpus the encoders were calibrated and distilled on
  templates   the Moving-MNIST captions the video models are trained with ("the digit 3 moves left")

    python -m mediagen.text.encoders.compare [--names minilm-hla-distilled ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

VARIED = [
    "The meeting has been moved to Thursday afternoon.",
    "Could you pass me the salt, please?",
    "She learned to play the cello when she was eleven.",
    "Interest rates rose by a quarter of a percentage point last month.",
    "My grandmother grows tomatoes, beans and courgettes in her garden.",
    "Why does the kettle always switch itself off too early?",
    "The train from Leeds was delayed by forty minutes because of a signal failure.",
    "Add two cups of flour and stir until the batter is smooth.",
    "He forgot his umbrella, so he arrived soaked.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "The museum is closed on Mondays.",
    "I can't believe how quickly the summer went by!",
    "Please restart your computer before installing the update.",
    "A flock of geese flew south over the frozen lake.",
    "The defendant pleaded not guilty to all three charges.",
    "Our team won the match three goals to one.",
    "What time does the pharmacy open tomorrow?",
    "The novel follows two sisters who inherit a crumbling hotel by the sea.",
    "Turn left at the second roundabout and the school is on your right.",
    "Volcanic ash grounded hundreds of flights across northern Europe.",
    "He whispered something, but nobody in the room heard it.",
    "The recipe serves four people and takes about an hour.",
    "Scientists detected water vapour in the atmosphere of a distant planet.",
    "Don't forget to water the plants while I'm away.",
    "The orchestra tuned up as the audience found their seats.",
    "Unemployment fell to its lowest level in a decade.",
    "The cat knocked a glass off the table and walked away calmly.",
    "Is it true that octopuses have three hearts?",
    "The bridge was built in 1889 and repainted every seven years.",
    "After the storm, the village spent a week without electricity.",
]
DIRECTIONS = ("left", "right", "up", "down")


def template_prompts() -> list[str]:
    """The Moving-MNIST caption forms: one digit (all 40), and two digits in a fixed sample of pairs."""
    one = [f"the digit {d} moves {m}" for d in range(10) for m in DIRECTIONS]
    two = [f"the digit {d} moves {DIRECTIONS[d % 4]} while the digit {(3 * d + 1) % 10} moves {DIRECTIONS[(d + 1) % 4]}"
           for d in range(10)]
    return one + two


@torch.no_grad()
def sentence_embeddings(encoder, prompts: list[str], max_length: int = 64) -> torch.Tensor:
    """(N, C) mean-pooled, l2-normalised sentence embeddings of a ``PromptEncoder``."""
    from .distill import mean_pool

    embeds, mask = encoder.encode(prompts, max_length=max_length, padding="longest")
    return mean_pool(embeds.float(), mask)


def similarity_table(names: list[str], sets: dict[str, list[str]] | None = None) -> list[dict]:
    """Per encoder name: mean and minimum cosine to MiniLM on each set, and the load time."""
    from . import load_text_encoder

    sets = sets or {"varied": VARIED, "templates": template_prompts()}
    minilm = load_text_encoder("minilm")
    reference = {k: sentence_embeddings(minilm, v) for k, v in sets.items()}
    rows = []
    for name in names:
        t0 = time.perf_counter()
        encoder = load_text_encoder(name)
        row = {"name": name, "load_s": round(time.perf_counter() - t0, 2)}
        for k, prompts in sets.items():
            cos = (sentence_embeddings(encoder, prompts) * reference[k]).sum(-1)
            row[f"{k}_mean"], row[f"{k}_min"] = round(cos.mean().item(), 4), round(cos.min().item(), 4)
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| encoder | varied: mean cos | varied: min | templates: mean cos | templates: min | load s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['varied_mean']:.4f} | {r['varied_min']:.4f} | {r['templates_mean']:.4f} "
                     f"| {r['templates_min']:.4f} | {r['load_s']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--names", nargs="+", default=["minilm-mlra2-distilled", "minilm-hla-distilled", "minilm-sdpa",
                                                  "minilm-mlra2", "minilm-mlra4", "minilm-hla"])
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    rows = similarity_table(args.names)
    print(f"cosine to MiniLM's sentence embedding: {len(VARIED)} varied sentences, "
          f"{len(template_prompts())} template prompts")
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
