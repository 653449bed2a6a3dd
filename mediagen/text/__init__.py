"""The text stack: the text encoders that condition the video model, with their attentions and kernels.

  kernels/    HLA's chunk maps and read-out, MLRA's latent decode: functions, no nn.Modules
  attention/  token mixers on hidden states (B, N, C) with their own projections: HLA, MLRA, MHA
  encoders/   the MiniLM-shaped encoders built on them, their distillation, ``load_text_encoder``

The stack sits above ``mediagen.attention`` (it reuses ``SDPAttention``) and below
``mediagen.models`` (docs/DESIGN.md#layers-and-imports). Nothing is imported here, so
``import mediagen.text`` stays light.
"""
