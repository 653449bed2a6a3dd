"""How far a text encoder's token states tie each digit of a two-digit caption to its own direction.

A video model conditioned on per-token states can bind "3" to "left" in "the digit 3 moves left while the digit
8 moves down" only if some token's state depends on both. For template captions over every digit pair (two
different digits) and direction pair (two different ways), with the same caption's directions swapped as the
counterpart ("... 3 moves down while ... 8 moves left"):

- digit token, ways swapped: cosine of a digit token's state between the caption and its counterpart. Near 1:
  the digit's state does not say which way it moves;
- way token, digits swapped: cosine of a direction token's state when the two digits trade places;
- digit token, digit changed (control): cosine of a digit token's state when that digit is replaced by another.
  What the states do carry, for scale.

    python -m benchmarks text_binding                 # MiniLM (the shipped video models' encoder), CPU, 240 pairs
    python -m benchmarks text_binding --pairs 24      # fewer captions

(from the repository root)
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch

from mediagen.training.data.moving_mnist import DIRECTIONS, clip_caption


def caption_pairs(n: int, seed: int = 0) -> list[tuple[tuple[int, int], tuple[str, str]]]:
    """``n`` (digits, directions) draws with two different digits and two different ways."""
    every = [(d, m) for d in itertools.permutations(range(10), 2) for m in itertools.permutations(DIRECTIONS, 2)]
    pick = np.random.default_rng(seed).choice(len(every), size=min(n, len(every)), replace=False)
    return [every[i] for i in sorted(pick)]


def token_states(encode, caption: str, words: list[str]) -> list[torch.Tensor]:
    """The state of each of ``words``' tokens in ``caption`` (each word one token, taken in caption order)."""
    tokens, states = encode(caption)
    out, start = [], 0
    for w in words:
        i = tokens.index(w, start)
        out.append(states[i])
        start = i + 1
    return out


def binding_cosines(encode, pairs) -> dict[str, float]:
    """Mean cosines (see the module docstring) over ``pairs``; ``encode(caption) -> (tokens, states)``."""
    cos = torch.nn.functional.cosine_similarity
    rows = {"digit token, ways swapped": [], "way token, digits swapped": [], "digit token, digit changed": []}
    for (d1, d2), (m1, m2) in pairs:
        words = [str(d1), m1, str(d2), m2]
        base = token_states(encode, clip_caption([d1, d2], [m1, m2]), words)
        ways = token_states(encode, clip_caption([d1, d2], [m2, m1]), [str(d1), m2, str(d2), m1])
        digits = token_states(encode, clip_caption([d2, d1], [m1, m2]), [str(d2), m1, str(d1), m2])
        other = next(d for d in range(10) if d not in (d1, d2))
        changed = token_states(encode, clip_caption([other, d2], [m1, m2]), [str(other), m1, str(d2), m2])
        rows["digit token, ways swapped"] += [float(cos(base[0], ways[0], dim=0)), float(cos(base[2], ways[2], dim=0))]
        rows["way token, digits swapped"] += [float(cos(base[1], digits[1], dim=0)),
                                              float(cos(base[3], digits[3], dim=0))]
        rows["digit token, digit changed"].append(float(cos(base[0], changed[0], dim=0)))
    return {k: float(np.mean(v)) for k, v in rows.items()}


def minilm_encoder(max_length: int = 64):
    from mediagen.text.encoders.minilm import load_minilm, load_minilm_tokenizer

    tok, model = load_minilm_tokenizer(), load_minilm()

    @torch.no_grad()
    def encode(caption: str):
        batch = tok(caption, return_tensors="pt", padding="max_length", max_length=max_length, truncation=True)
        return tok.convert_ids_to_tokens(batch["input_ids"][0]), model(**batch).last_hidden_state[0].float()

    return encode


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks text_binding", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=240, help="captions drawn (two digits, two ways each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-length", type=int, default=64, help="tokens, as the video models encode prompts")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} is not allowed: use 1 or more")
    result = binding_cosines(minilm_encoder(args.max_length), caption_pairs(args.pairs, args.seed))
    print(f"MiniLM, {args.pairs} two-digit template captions, {args.max_length} tokens; mean cosine of token states:")
    for name, value in result.items():
        print(f"  {name:<28} {value:.3f}")
    return result


if __name__ == "__main__":
    main()
