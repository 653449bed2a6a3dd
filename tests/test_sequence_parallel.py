"""Sequence-parallel MHLA on 2 CPU processes (gloo): outputs and gradients (Mc's too) equal the
single-process result, for the attention op and for a sharded Wan transformer."""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mediagen.attention.sequence_parallel import sequence_parallel_mhla, shard_layout, shard_tokens, sum_gradients
from mediagen.kernels import mhla_reference

GRID, BLOCKS, B, H, D = (6, 3, 5), (4, 2, 2), 1, 2, 16  # ragged blocks along every axis
SEED = 0  # the op tests' problem: fixed, so that a failure reproduces (every rank draws it from this seed)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, per_head, seed, rope=False):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(seed)  # every rank draws the same full problem
        N, M = math.prod(GRID), math.prod(BLOCKS)
        q, k, v = (torch.randn(B, N, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
        mix = torch.rand((H, M, M) if per_head else (M, M), generator=gen, dtype=torch.float64)
        g = torch.randn(B, N, H, D, generator=gen, dtype=torch.float64)
        angles = torch.rand(N, D // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        tables = (angles.cos(), angles.sin()) if rope else None
        full = [t.clone().requires_grad_() for t in (q, k, v, mix)]
        ref = mhla_reference(*full, GRID, BLOCKS, feature_map="elu1", rope=tables)
        ref_grads = torch.autograd.grad(ref, full, g)

        local = [shard_tokens(t, GRID, BLOCKS, rank, world).float().contiguous().requires_grad_() for t in (q, k, v)]
        mix32 = mix.float().requires_grad_()
        # each rank passes the table rows of its own tokens
        rope32 = None if tables is None else tuple(shard_tokens(t[None], GRID, BLOCKS, rank, world)[0].float()
                                                   for t in tables)
        o = sequence_parallel_mhla(*local, mix32, GRID, BLOCKS, feature_map="elu1", rope=rope32)
        grads = list(torch.autograd.grad(o, (*local, mix32), shard_tokens(g, GRID, BLOCKS, rank, world).float()))
        dist.all_reduce(grads[3])  # each rank holds its query rows' share of dMc

        def rel(a, b):
            return ((a.double() - b).norm() / b.norm()).item()

        assert rel(o, shard_tokens(ref, GRID, BLOCKS, rank, world)) < 1e-5
        for a, b in zip(grads[:3], ref_grads[:3]):
            assert rel(a, shard_tokens(b, GRID, BLOCKS, rank, world)) < 1e-5
        assert rel(grads[3], ref_grads[3]) < 1e-5
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("per_head", [True])
def test_two_ranks_match_single_process(per_head):
    mp.spawn(_worker, args=(2, _free_port(), per_head, SEED), nprocs=2)


def test_two_ranks_with_rope_match_single_process():
    """RoPE on the numerator's features: each rank rotates its own tokens with their rows of the tables."""
    mp.spawn(_worker, args=(2, _free_port(), False, SEED, True), nprocs=2)


def test_shards_are_whole_blocks_covering_the_grid():
    world = 2
    spans = [shard_layout(GRID, BLOCKS, r, world)[:2] for r in range(world)]
    assert spans[0][0] == 0 and spans[0][1] == spans[1][0] and spans[1][1] == math.prod(GRID)
    _, _, order, offsets = shard_layout(GRID, BLOCKS, 1, world)
    assert offsets.numel() == math.prod(BLOCKS) // world + 1
    assert sorted(order.tolist()) == list(range(spans[1][1] - spans[1][0]))


def test_blocks_must_split_evenly():
    with pytest.raises(ValueError, match="divisible by the world size 3"):
        shard_layout(GRID, BLOCKS, 0, 3)


def _wan_worker(rank, world, port, rope="none"):
    from mediagen import convert
    from mediagen.models.presets import build_transformer, preset
    from mediagen.models.sequence_parallel import enable_sequence_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # same weights and inputs on every rank
        model = convert(build_transformer("wan-tiny"), "mhla", blocks=(2, 2, 2), rope=rope).eval()
        p = preset("wan-tiny")
        latents = torch.randn(2, p["config"]["in_channels"], p["frames"], p["height"], p["width"])
        text = torch.randn(2, 5, p["config"]["text_dim"])
        t = torch.tensor([300, 700])
        want = model(latents, t, text).sample
        want.square().mean().backward()
        want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        enable_sequence_parallel(model)
        got = model(latents, t, text).sample
        assert got.shape == want.shape
        assert ((got - want).norm() / want.norm()).item() < 1e-4
        got.square().mean().backward()  # the same loss on every rank
        sum_gradients(model)
        for name, g in want_grads.items():
            p = dict(model.named_parameters())[name]
            assert ((p.grad - g).norm() / g.norm().clamp_min(1e-12)).item() < 1e-3, name
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("rope", ["none", "features"])
def test_wan_transformer_sequence_parallel_matches_single_process_with_gradients(rope):
    mp.spawn(_wan_worker, args=(2, _free_port(), rope), nprocs=2)


def _pipeline_worker(rank, world, port):
    from mediagen import convert
    from mediagen.pipelines import build_pipeline

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pipe = build_pipeline("wan-tiny", seed=0)
        convert(pipe, "mhla", blocks=(2, 2, 2))
        pipe.set_progress_bar_config(disable=True)
        kw = dict(prompt=["the digit 3 moves left"], height=8, width=8, num_frames=4, num_inference_steps=3,
                  output_type="np")
        want = pipe(generator=torch.Generator().manual_seed(1), **kw).frames
        pipe.enable_sequence_parallel()
        got = pipe(generator=torch.Generator().manual_seed(1), **kw).frames
        assert got.shape == want.shape and abs(got - want).max() < 1e-4
    finally:
        dist.destroy_process_group()


def test_text_to_video_pipeline_sequence_parallel_gives_the_same_video():
    mp.spawn(_pipeline_worker, args=(2, _free_port()), nprocs=2)


def test_sequence_parallel_refuses_softmax_layers():
    from mediagen import convert
    from mediagen.models.presets import build_transformer
    from mediagen.models.sequence_parallel import _check

    model = convert(build_transformer("wan-tiny"), "mhla", blocks=(2, 2, 2), layers=[0])
    with pytest.raises(ValueError, match="MHLA in every self-attention layer; layers \\[1\\]"):
        _check(model, 2)


def test_an_exchange_runs_the_chunked_steps_with_whole_block_summaries():
    from mediagen.kernels.mhla.exchange import BlockExchange
    from mediagen.kernels.mhla.triton_op import mhla_triton

    q, mix = torch.zeros(1, 8, 1, 16), torch.eye(4)
    with pytest.raises(ValueError, match="algorithm='dense' is not allowed with an exchange"):
        mhla_triton(q, q, q, mix, (8,), (4,), algorithm="dense", exchange=BlockExchange())
    with pytest.raises(ValueError, match="splits=2 is not allowed with an exchange: use None or 1"):
        mhla_triton(q, q, q, mix, (8,), (4,), splits=2, exchange=BlockExchange())
