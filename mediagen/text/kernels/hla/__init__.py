"""Gated DeltaNet and HLA (hierarchical affine history) as pure functions: a token-by-token
reference (``naive``), a plain-PyTorch chunked path (``chunk``), chunk gates (``router``), the
flash-linear-attention backend for CUDA (``fla_backend``, imported lazily), and for inference two
Triton kernels: the layer's inputs in one pass (``triton_prepare``) and the readout, gates and walk in
one kernel (``triton_readout``, dispatched by ``readout``). Sequences of up to two chunks: ``short``
(the closed form in torch ops, or two Triton launches, ``triton_short``)."""

from .chunk import (chunk_summaries, gated_delta_rule_chunked, hla_chunked, hla_walk, hla_walk_sparse,
                    pad_to_chunks, select_chunks)
from .fla_backend import fla_available
from .naive import chunk_maps_recurrent, gdn_recurrent, hla_recurrent
from .router import bucket_representatives, chunk_gates, gate_regularisers

__all__ = ["chunk_summaries", "gated_delta_rule_chunked", "hla_chunked", "hla_walk", "hla_walk_sparse",
           "pad_to_chunks", "select_chunks", "fla_available", "chunk_maps_recurrent", "gdn_recurrent",
           "hla_recurrent", "bucket_representatives", "chunk_gates", "gate_regularisers"]
