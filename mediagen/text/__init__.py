"""The text stack: what the text encoders that condition the video model are built from.

  kernels/    HLA's chunk maps and read-out, MLRA's latent decode: functions, no nn.Modules
  attention/  token mixers on hidden states (B, N, C) with their own projections: HLA, MLRA, MHA

The stack sits above ``mediagen.attention`` (it reuses ``SDPAttention``) and below
``mediagen.models`` (docs/DESIGN.md#layers-and-imports). Nothing is imported here, so
``import mediagen.text`` stays light.
"""
