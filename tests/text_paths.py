"""Shared by the MLRA and HLA tests: random padding masks, an fp32-rounding comparison, and running a
layer's short and long paths on the same input for outputs and gradients."""

import torch


def padding_mask(b, n, kind, seed):
    """None ("none"), or a (b, n) mask of 1 = real: "right" / "left" padding of random lengths, or
    "holes" anywhere (the first token always real)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    pos = torch.arange(n)
    if kind == "right":
        return (pos[None] < lengths[:, None]).long()
    if kind == "left":
        return (pos[None] >= n - lengths[:, None]).long()
    mask = (torch.rand(b, n, generator=g) > 0.4).long()
    mask[:, 0] = 1
    return mask


def assert_close_fp32(got, want, what, tol=2e-5, floor=0.0):
    """L2 error within fp32 rounding of a reordered computation: below ``tol`` relative to want's norm,
    plus ``floor``. A wrong fold, mask, decay or gate gives relative errors of order 1."""
    diff, ref = (got.double() - want.double()).norm().item(), want.double().norm().item()
    assert diff <= tol * ref + floor, f"{what}: L2 error {diff:.2e} against norm {ref:.2e}"


def short_and_long(m, x, mask, weight):
    """[(output, input gradient, {parameter: gradient}) of m._forward_short, the same of
    m._forward_long], the loss being (output * weight).sum(); parameters without a gradient left out."""
    results = []
    for path in (m._forward_short, m._forward_long):
        m.zero_grad()
        xi = x.clone().requires_grad_()
        out = path(xi, mask)
        (out * weight).sum().backward()
        grads = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
        results.append((out.detach(), xi.grad, grads))
    return results
