"""Sequence-parallel MHLA on 2 CPU processes (gloo): outputs and gradients (Mc's too) equal the
single-process op's, for the attention op and for a sharded Wan transformer; the bytes each rank sends
per layer are ``exchange_bytes``, a function of shapes alone."""

import json
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from mediagen.attention.sequence_parallel import (exchange_bytes, sequence_parallel_mhla, shard_layout, shard_tokens,
                                                  sum_gradients)
from mediagen.kernels import mhla_reference

# The ranks are CPU processes over gloo running the Triton kernels in the interpreter, which conftest turns on only
# where there is no GPU: on a GPU machine the kernels would be handed CPU tensors
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="2 CPU processes under the Triton interpreter (TRITON_INTERPRET=1, set on "
                                       "machines without a GPU)")

GRID, BLOCKS, B, H, D = (6, 3, 5), (4, 2, 2), 1, 2, 16  # ragged blocks along every axis
SEED = 0  # the op tests' problem: fixed, so that a failure reproduces (every rank draws it from this seed)

# The op's cases: dtype x RoPE x normalize x how the frames split between the 2 ranks. Blocks (2, 2, 2):
# each rank holds one block row of frames; 4 frames split 2 + 2, 5 frames split 2 + 3 (ragged), and the
# 3 rows of the second axis are cut 1 + 2 in every case. Mc is per head where RoPE is on, shared elsewhere.
OP_BLOCKS = (2, 2, 2)
OP_GRIDS = {"even": (4, 3, 4), "ragged": (5, 3, 4)}
OP_CASES = [f"{dtype}-{rope}-{norm}-{split}" for dtype in ("fp32", "bf16") for rope in ("rope", "norope")
            for norm in ("normalize", "nonormalize") for split in ("even", "ragged")
            if dtype == "fp32" or split == "ragged"]
OP_CASES.append("bf16-rope-normalize-ragged-nograd")  # a forward nothing differentiates: bf16 summaries travel
# relative L2 error allowed against the single-process op (the same kernels; only the order of the ranks'
# fp32 sums differs: measured <= 3e-7 in fp32, <= 1e-5 in bf16, where one rounding flip of a bf16 dk entry
# is 4e-3 of that entry) and against the fp64 reference (measured <= 3e-7 in fp32, <= 5e-3 in bf16)
TOL_ONE = {"fp32": 1e-5, "bf16": 2e-3}
TOL_REF = {"fp32": 1e-5, "bf16": 2e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _SentBytes(TorchDispatchMode):
    """Bytes this rank sends through the c10d collectives issued inside it, counted as ``exchange_bytes``
    counts them: all-gather (P-1) x the rank's input, reduce-scatter (P-1)/P x it, all-reduce 2(P-1)/P x it.
    A collective not in the table is recorded by name, so the test fails on it."""

    RULES = {"allgather_": (1, lambda P: P - 1), "_allgather_base_": (1, lambda P: P - 1),
             "reduce_scatter_": (1, lambda P: (P - 1) / P), "_reduce_scatter_base_": (1, lambda P: (P - 1) / P),
             "allreduce_": (0, lambda P: 2 * (P - 1) / P)}

    def __init__(self, world):
        super().__init__()
        self.world, self.sent, self.unknown = world, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns, _, name = func._schema.name.partition("::")
        if ns == "c10d" and name not in ("barrier", "monitored_barrier"):
            if name not in self.RULES:
                self.unknown.append(name)
            else:
                index, share = self.RULES[name]
                tensors = args[index] if isinstance(args[index], (list, tuple)) else [args[index]]
                payload = sum(t.numel() * t.element_size() for t in tensors)
                self.sent += round(payload * share(self.world))
        return func(*args, **(kwargs or {}))


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _op_case(case, rank, world):
    """One case of the op on this rank: errors against the single-process op and the fp64 reference, and
    the bytes sent against ``exchange_bytes``."""
    from mediagen.kernels.mhla.triton_op import mhla_triton

    dtype_name, rope, norm, split, *rest = case.split("-")
    dtype, grad = DTYPES[dtype_name], rest != ["nograd"]
    grid, blocks = OP_GRIDS[split], OP_BLOCKS
    gen = torch.Generator().manual_seed(SEED)  # every rank draws the same full problem
    N, M = math.prod(grid), math.prod(blocks)
    q, k, v = (torch.randn(B, N, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
    mix = torch.rand((H, M, M) if rope == "rope" else (M, M), generator=gen, dtype=torch.float64)
    g = torch.randn(B, N, H, D, generator=gen, dtype=torch.float64)
    angles = torch.rand(N, D // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    tables = (angles.cos(), angles.sin()) if rope == "rope" else None
    options = dict(feature_map="elu1", normalize=norm == "normalize", scale=None if norm == "normalize" else 0.05)

    def cut(t):
        return shard_tokens(t, grid, blocks, rank, world)

    full = [t.clone().requires_grad_(grad) for t in (q, k, v, mix)]
    ref = mhla_reference(*full, grid, blocks, rope=tables, **options)
    # the single-process op: the same chunked kernels, one split per block as the exchange runs them
    low = [t.to(dtype).requires_grad_(grad) for t in (q, k, v)] + [mix.float().requires_grad_(grad)]
    low_tables = None if tables is None else tuple(t.to(dtype) for t in tables)
    with torch.set_grad_enabled(grad):
        one = mhla_triton(*low, grid, blocks, rope=low_tables, algorithm="chunked", splits=1, **options)
    local = [cut(t.detach()).contiguous().requires_grad_(grad) for t in low[:3]]
    local_mix = low[3].detach().clone().requires_grad_(grad)
    local_tables = None if low_tables is None else tuple(cut(t[None])[0] for t in low_tables)  # its tokens' rows
    with _SentBytes(world) as forward_sent, torch.set_grad_enabled(grad):
        o = sequence_parallel_mhla(*local, local_mix, grid, blocks, rope=local_tables, **options)
    errors = {"o": _rel(o, cut(one)), "o_ref": _rel(o, cut(ref))}
    backward_sent = _SentBytes(world)
    if grad:
        ref_grads = torch.autograd.grad(ref, full, g)
        one_grads = torch.autograd.grad(one, low, g.to(dtype))
        with backward_sent:
            grads = list(torch.autograd.grad(o, (*local, local_mix), cut(g).to(dtype)))
        dist.all_reduce(grads[3])  # each rank holds its query rows' share of dMc
        for name, got, want, exact in zip(("dq", "dk", "dv"), grads, one_grads, ref_grads):
            errors[name], errors[name + "_ref"] = _rel(got, cut(want)), _rel(got, cut(exact))
        errors["dmix"], errors["dmix_ref"] = _rel(grads[3], one_grads[3]), _rel(grads[3], ref_grads[3])
    expected = exchange_bytes(grid, blocks, batch=B, heads=H, head_dim=D, world=world, dtype=dtype, backward=grad,
                              backend="gloo")
    return {"errors": errors, "sent": {"forward": forward_sent.sent, "backward": backward_sent.sent},
            "expected": expected, "unknown": forward_sent.unknown + backward_sent.unknown}


def _op_worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {case: _op_case(case, rank, world) for case in OP_CASES}
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def op_results(tmp_path_factory):
    """Every case of OP_CASES on 2 ranks in one spawn (starting the processes costs more than a case):
    {case: [rank 0's result, rank 1's]}."""
    out = tmp_path_factory.mktemp("sequence_parallel_op")
    mp.spawn(_op_worker, args=(2, _free_port(), str(out)), nprocs=2)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {case: [r[case] for r in ranks] for case in OP_CASES}


@pytest.mark.parametrize("case", OP_CASES)
def test_two_ranks_match_the_single_process_op(op_results, case):
    """Output and the gradients of q, k, v (each rank's slab) and Mc (summed over the ranks) against the
    single-process op and the fp64 reference."""
    dtype = case.split("-")[0]
    names = ["o", "dq", "dk", "dv", "dmix"] if not case.endswith("nograd") else ["o"]
    for rank, result in enumerate(op_results[case]):
        errors = result["errors"]
        assert sorted(errors) == sorted(names + [n + "_ref" for n in names]), errors
        for name in names:
            assert errors[name] < TOL_ONE[dtype], (rank, name, errors)
            assert errors[name + "_ref"] < TOL_REF[dtype], (rank, name, errors)


@pytest.mark.parametrize("case", OP_CASES)
def test_bytes_sent_are_exchange_bytes(op_results, case):
    """What the exchange hands to the collectives, counted as it runs, is what ``exchange_bytes`` says."""
    for rank, result in enumerate(op_results[case]):
        assert result["unknown"] == [], result
        assert result["sent"] == result["expected"], (rank, result)
        assert result["sent"]["forward"] > 0 and (result["sent"]["backward"] > 0) == (not case.endswith("nograd"))


def _one_block_worker(rank, world, port, out_dir):
    """Each of the ranks holds one block of two: Mc does not cancel (two blocks, normalize), so its gradient summed
    over the ranks is the single-process one, not the exact zero of a one-block Mc."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        grid, blocks = (7, 3), (2, 1)
        gen = torch.Generator().manual_seed(SEED)
        q, k, v, g = (torch.randn(B, math.prod(grid), H, D, generator=gen) for _ in range(4))
        mix = torch.rand(2, 2, generator=gen)
        full = [t.double().requires_grad_() for t in (q, k, v, mix)]
        (want,) = torch.autograd.grad(mhla_reference(*full, grid, blocks, feature_map="relu"), full[3], g.double())
        local = [shard_tokens(t, grid, blocks, rank, world).contiguous() for t in (q, k, v)]
        local_mix = mix.clone().requires_grad_()
        o = sequence_parallel_mhla(*local, local_mix, grid, blocks, feature_map="relu")
        (got,) = torch.autograd.grad(o, local_mix, shard_tokens(g, grid, blocks, rank, world))
        dist.all_reduce(got)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"dmix": _rel(got, want), "norm": want.norm().item()}, f)
    finally:
        dist.destroy_process_group()


def test_mix_gradient_with_one_block_per_rank(tmp_path):
    mp.spawn(_one_block_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    for r in range(2):
        result = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert result["norm"] > 0 and result["dmix"] < 1e-5, (r, result)


# latent frames of Wan's VAE (4x in time) at 21, 41 and 81 video frames; 480x832 -> 30 x 52 tokens
WAN_480P_LATENT_FRAMES = {21: 6, 41: 11, 81: 21}


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_bytes_per_layer_at_wan_480p_are_the_formula_whatever_the_frames(backend):
    """Wan2.1-1.3B's attention (12 heads x 128, batch 1) on 2 ranks with blocks 4 x 5 x 4: each rank sends
    its 40 blocks' summaries, (P-1) * B*H*(M/P)*(D^2 + D) * 4 bytes = 31,703,040 in fp32 (bf16 inputs keep
    fp32 summaries for the backward), the same again to sum the dS on NCCL and twice that on gloo (an
    all-reduce); 15,851,520 in a bf16 forward nothing differentiates. Equal at every frame count."""
    world, blocks, heads, head_dim = 2, (4, 5, 4), 12, 128
    per_rank = 1 * heads * (math.prod(blocks) // world) * (head_dim * head_dim + head_dim)
    for frames, latent_frames in WAN_480P_LATENT_FRAMES.items():
        assert (frames - 1) // 4 + 1 == latent_frames
        grid = (latent_frames, 480 // 16, 832 // 16)
        got = exchange_bytes(grid, blocks, batch=1, heads=heads, head_dim=head_dim, world=world,
                             dtype=torch.bfloat16, backend=backend)
        assert got == {"forward": (world - 1) * per_rank * 4,
                       "backward": (world - 1) * per_rank * 4 * (2 if backend == "gloo" else 1)}, frames
        assert got["forward"] == 31_703_040
        sampling = exchange_bytes(grid, blocks, batch=1, heads=heads, head_dim=head_dim, world=world,
                                  dtype=torch.bfloat16, backward=False, backend=backend)
        assert sampling == {"forward": 15_851_520, "backward": 0}


def test_exchange_bytes_refuses_bad_arguments():
    common = dict(batch=1, heads=2, head_dim=16)
    with pytest.raises(ValueError, match="blocks\\[0\\]=3 must be divisible by the world size 2"):
        exchange_bytes((6, 4, 4), (3, 2, 2), world=2, **common)
    with pytest.raises(ValueError, match="world=0 is not allowed: use the number of ranks, an int >= 1"):
        exchange_bytes((6, 4, 4), (2, 2, 2), world=0, **common)
    with pytest.raises(ValueError, match="backend='mpi' is not allowed: use 'nccl' or 'gloo'"):
        exchange_bytes((6, 4, 4), (2, 2, 2), world=2, backend="mpi", **common)
    with pytest.raises(ValueError, match="heads=0 is not allowed: use an int >= 1"):
        exchange_bytes((6, 4, 4), (2, 2, 2), world=2, batch=1, heads=0, head_dim=16)
    with pytest.raises(ValueError, match="dtype=torch.float64 is not allowed"):
        exchange_bytes((6, 4, 4), (2, 2, 2), world=2, dtype=torch.float64, **common)


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


def test_sequence_parallel_on_a_cpu_needs_the_triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.zeros(1, 8, 1, 16)
    with pytest.raises(ValueError, match="q is on cpu: sequence-parallel MHLA runs the Triton kernels, on CUDA GPUs, "
                                         "or on a CPU with TRITON_INTERPRET=1"):
        sequence_parallel_mhla(q, q, q, torch.eye(4), (8,), (4,))
