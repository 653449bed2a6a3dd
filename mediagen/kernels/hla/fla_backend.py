"""Chunk summaries through flash-linear-attention's ``chunk_gated_delta_rule`` (CUDA only).

One call over all chunks at once: chunks become batch entries, the values are padded with K zero
columns and every chunk starts from the state [0 | I]. Because the recurrence is linear in the state,
the output's last K columns are r_t (the effective query of the start state) and the final state is
[b_c | A_c]. Imported lazily: fla is optional and needs a GPU.
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


def chunk_summaries_fla(q, k, v, log_alpha, beta, scale: float, chunk: int):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    b, n, h, dk = q.shape
    dv = v.shape[-1]
    nc = n // chunk

    def per_chunk(x):                                   # (B,N,H,...) -> (B*nC, C, H, ...)
        return x.reshape(b * nc, chunk, *x.shape[2:])

    v_pad = F.pad(v, (0, dk))
    eye = torch.eye(dk, device=q.device, dtype=torch.float32)
    init = torch.cat([q.new_zeros(b * nc, h, dk, dv, dtype=torch.float32),
                      eye.expand(b * nc, h, dk, dk)], dim=-1).contiguous()
    o, final = chunk_gated_delta_rule(per_chunk(q), per_chunk(k), per_chunk(v_pad),
                                      g=per_chunk(log_alpha).float(), beta=per_chunk(beta), scale=scale,
                                      initial_state=init, output_final_state=True)
    o = o.reshape(b, nc, chunk, h, dv + dk).movedim(3, 1)            # (B,H,nC,C,V+K)
    final = final.reshape(b, nc, h, dk, dv + dk).movedim(2, 1)       # (B,H,nC,K,V+K)
    return (o[..., :dv], o[..., dv:].float(), final[..., dv:].to(torch.float32),
            final[..., :dv].to(torch.float32))
