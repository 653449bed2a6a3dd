"""The text stack's kernels: Triton kernels and their plain-PyTorch references (no nn.Modules here).

  hla/            HLA's chunk maps, gates and fused read-out (and the Gated DeltaNet it extends)
  latent_decode/  MLRA's single-token decode over the latent cache, up-projections absorbed
  short_prepare/  MLRA's short path: the norms and rotations around its GEMMs, one launch each

They share ``mediagen.kernels.triton_dot`` with the MHLA kernels.
"""
