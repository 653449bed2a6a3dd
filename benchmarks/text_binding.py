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

--probe: whether a text refiner (``mediagen.models.text_refiner``, one block) can put each digit's own way into the
digit token's state. A linear readout of the way from the digit token's state, trained on 900 of the 1,080 captions
(every digit pair and way pair) and scored on the other 180: once on the states as they are (the refiner frozen at its
identity init) and once with the refiner trained with the readout.

    python -m benchmarks text_binding                 # MiniLM (the shipped video models' encoder), CPU, 240 pairs
    python -m benchmarks text_binding --pairs 24      # fewer captions
    python -m benchmarks text_binding --probe         # and the refiner probe (a few minutes on a CPU)

(from the repository root)
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch

from mediagen.training.data.moving_mnist import DIRECTIONS, clip_caption


def every_pair() -> list[tuple[tuple[int, int], tuple[str, str]]]:
    """Every (digits, directions) with two different digits and two different ways (1,080)."""
    return [(d, m) for d in itertools.permutations(range(10), 2) for m in itertools.permutations(DIRECTIONS, 2)]


def caption_pairs(n: int, seed: int = 0) -> list[tuple[tuple[int, int], tuple[str, str]]]:
    """``n`` of ``every_pair()``, drawn without repeats."""
    every = every_pair()
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


def refiner_probe(encode, steps: int = 300, held_out: int = 180, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy of reading each digit's way from its token's state, without and with a trained
    ``TextRefiner`` (see the module docstring). ``encode(caption) -> (tokens, states)``."""
    from mediagen.models.text_refiner import TextRefiner

    ways = list(DIRECTIONS)
    every = every_pair()
    order = np.random.default_rng(seed).permutation(len(every))
    states, where, label = [], [], []
    for i in order:
        (d1, d2), (m1, m2) = every[i]
        tokens, h = encode(clip_caption([d1, d2], [m1, m2]))
        first = tokens.index(str(d1))
        states.append(h)
        where.append((first, tokens.index(str(d2), first + 1)))
        label.append((ways.index(m1), ways.index(m2)))
    x, where, label = torch.stack(states).float(), torch.tensor(where), torch.tensor(label)
    train = len(x) - held_out

    def accuracy(trained: bool) -> float:
        torch.manual_seed(seed)
        refiner, head = TextRefiner(x.shape[-1], layers=1), torch.nn.Linear(x.shape[-1], len(ways))
        opt = torch.optim.AdamW(list(head.parameters()) + (list(refiner.parameters()) if trained else []), 1e-3)

        def logits(idx):
            s, b = refiner(x[idx]), torch.arange(len(idx))
            return (torch.cat([head(s[b, where[idx, 0]]), head(s[b, where[idx, 1]])]),
                    torch.cat([label[idx, 0], label[idx, 1]]))

        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            out, y = logits(torch.randint(0, train, (64,), generator=g))
            loss = torch.nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            out, y = logits(torch.arange(train, len(x)))
        return float((out.argmax(-1) == y).float().mean())

    return {"way from the digit token, states as they are": accuracy(False),
            "way from the digit token, refiner trained": accuracy(True)}


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
    parser.add_argument("--probe", action="store_true", help="also the text refiner probe (module docstring)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} is not allowed: use 1 or more")
    encode = minilm_encoder(args.max_length)
    result = binding_cosines(encode, caption_pairs(args.pairs, args.seed))
    print(f"MiniLM, {args.pairs} two-digit template captions, {args.max_length} tokens; mean cosine of token states:")
    for name, value in result.items():
        print(f"  {name:<28} {value:.3f}")
    if args.probe:
        probe = refiner_probe(encode, seed=args.seed)
        print("refiner probe, 180 held-out captions, accuracy (chance 0.25):")
        for name, value in probe.items():
            print(f"  {name:<46} {value:.3f}")
        result.update(probe)
    return result


if __name__ == "__main__":
    main()
