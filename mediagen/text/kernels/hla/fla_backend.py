"""Chunk summaries through flash-linear-attention's ``chunk_gated_delta_rule`` (CUDA only).

One call over all chunks at once: chunks become batch entries, the values are padded with K zero
columns and every chunk starts from the state [0 | I]. Because the recurrence is linear in the state,
the output's last K columns are r_t (the effective query of the start state) and the final state is
[b_c | A_c]. Imported lazily: fla is optional and needs a GPU.

Without gradients the call goes through the custom op ``mediagen::gdn_chunk_states_fla`` (with a fake
implementation), so torch.compile treats fla's kernels as one opaque node instead of tracing into
fla's autograd function; with gradients fla is called directly (its backward trains the layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fla_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


def _gdn_chunk_states(q, k, v_pad, g, beta, scale: float, chunk: int):
    """fla on (B, N, H, ...) inputs cut into chunks of ``chunk`` tokens, each chunk its own sequence
    from the state [0 | I]. Returns fla's output (B·nC, C, H, V+K) and final states (B·nC, H, K, V+K)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    b, n, h, dk = q.shape
    nc = n // chunk

    def per_chunk(x):                                   # (B,N,H,...) -> (B*nC, C, H, ...)
        return x.reshape(b * nc, chunk, *x.shape[2:])

    eye = torch.eye(dk, device=q.device, dtype=torch.float32)
    init = torch.cat([q.new_zeros(b * nc, h, dk, v_pad.shape[-1] - dk, dtype=torch.float32),
                      eye.expand(b * nc, h, dk, dk)], dim=-1).contiguous()
    return chunk_gated_delta_rule(per_chunk(q), per_chunk(k), per_chunk(v_pad), g=per_chunk(g), beta=per_chunk(beta),
                                  scale=scale, initial_state=init, output_final_state=True)


@torch.library.custom_op("mediagen::gdn_chunk_states_fla", mutates_args=())
def gdn_chunk_states_fla(q: torch.Tensor, k: torch.Tensor, v_pad: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         scale: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_gdn_chunk_states`` as an opaque op for inference (no autograd registered)."""
    o, final = _gdn_chunk_states(q, k, v_pad, g, beta, scale, chunk)
    return o.contiguous(), final.contiguous()


@gdn_chunk_states_fla.register_fake
def _(q, k, v_pad, g, beta, scale, chunk):
    b, n, h, dk = q.shape
    nc, w = n // chunk, v_pad.shape[-1]
    return q.new_empty((b * nc, chunk, h, w)), q.new_empty((b * nc, h, dk, w), dtype=torch.float32)


def chunk_summaries_fla(q, k, v, log_alpha, beta, scale: float, chunk: int, v_pad=None):
    """``chunk.chunk_summaries_torch``'s (o_intra, r, A, b) from fla: o_intra and r in q's dtype,
    A and b in fp32. ``v_pad``: [v | 0] (B, N, H, V+K) when the caller already has it (the fused input
    pass writes it), saving the padding copy."""
    b, n, h, dk = q.shape
    dv = v.shape[-1]
    nc = n // chunk
    if v_pad is None:
        v_pad = F.pad(v, (0, dk))
    args = (q, k, v_pad, log_alpha.float(), beta, float(scale), int(chunk))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, log_alpha, beta))
    o, final = _gdn_chunk_states(*args) if needs_grad else gdn_chunk_states_fla(*args)
    o = o.reshape(b, nc, chunk, h, dv + dk).movedim(3, 1)            # (B,H,nC,C,V+K)
    final = final.reshape(b, nc, h, dk, dv + dk).movedim(2, 1)       # (B,H,nC,K,V+K)
    # r stays in q's dtype (fla's output dtype; no fp32 copy of N x K values), A and b are fp32 states
    return o[..., :dv], o[..., dv:], final[..., dv:], final[..., :dv]
