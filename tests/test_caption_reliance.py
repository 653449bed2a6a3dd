"""benchmarks.caption_reliance: the digit keys' share of the MHLA denominator, against a token-by-token sum."""

import torch

from benchmarks.caption_reliance import attention_share, digit_tokens
from mediagen.attention.mhla import MHLAttention


def brute_share(core, q, k, grid, tokens):
    blocks = core.blocks
    size = [g // b for g, b in zip(grid, blocks)]
    coords = [(f, h, w) for f in range(grid[0]) for h in range(grid[1]) for w in range(grid[2])]
    block = [((f // size[0]) * blocks[1] + h // size[1]) * blocks[2] + w // size[2] for f, h, w in coords]
    fq, fk = torch.relu(q.double()), torch.relu(k.double())
    mix = core.mix.double()
    total, count = 0.0, 0
    for b in range(q.shape[0]):
        for head in range(q.shape[2]):
            m = mix[head] if mix.dim() == 3 else mix
            for t in range(len(coords)):
                if not tokens[b, t]:
                    continue
                den = num = 0.0
                for s in range(len(coords)):
                    term = m[block[t], block[s]] * (fq[b, t, head] @ fk[b, s, head])
                    den += term
                    num += term * tokens[b, s]
                total += float(num / den)
                count += 1
    return total / count


def test_attention_share_matches_the_token_sum():
    g = torch.Generator().manual_seed(0)
    grid, heads, dim = (4, 4, 2), 2, 3
    core = MHLAttention((2, 2, 1), heads=heads)
    with torch.no_grad():
        core.mix.copy_(torch.rand(core.mix.shape, generator=g))
    n = 32
    q = torch.randn(2, n, heads, dim, generator=g).abs()  # every query sees some key: no 0 / 0
    k = torch.randn(2, n, heads, dim, generator=g)
    tokens = (torch.rand(2, n, generator=g) < 0.3).float()
    got = attention_share(core, q, k, grid, tokens)
    assert abs(got - brute_share(core, q, k, grid, tokens)) < 1e-5
    assert abs(attention_share(core, q, k, grid, torch.ones(2, n)) - 1.0) < 1e-6


def test_digit_tokens_marks_patches_with_ink():
    x0 = torch.full((1, 1, 2, 16, 16), -1.0)
    x0[0, 0, 1, 9, 3] = 1.0       # frame 1, patch row 1, patch column 0 of 8x8 patches
    tokens = digit_tokens(x0, (1, 8, 8))
    assert tokens.shape == (1, 8) and tokens.sum() == 1 and tokens[0, 4 + 2] == 1
