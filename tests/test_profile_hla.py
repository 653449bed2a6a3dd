"""benchmarks/profile_hla.py on the CPU: every stage of the real HLA layer is timed, and the layer's
functions are restored afterwards."""

import mediagen.text.attention.hla as hla_module
import mediagen.text.kernels.hla.chunk as chunk_module
from benchmarks import profile_hla as script


def test_tiny_profile_times_each_stage_and_restores_the_layer(capsys):
    originals = {(m, n): getattr(m, n) for m, n in script.STAGES}
    script.main(["--tiny", "--iters", "2"])
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}
    assert {"chunk_summaries", "hla_walk", "chunk_gates", "bucket_representatives"} <= set(rows)
    assert all(v > 0 for k, v in rows.items() if not k.startswith("rest"))
    assert all(getattr(m, n) is fn for (m, n), fn in originals.items())
    script.main(["--tiny", "--iters", "1", "--top-k", "2", "--route", "chunk"])
    assert "hla_walk_indexed" in capsys.readouterr().out
    script.main(["--tiny", "--iters", "1", "--readout", "triton"])  # the fused kernel, interpreted
    out = capsys.readouterr().out
    assert "| hla_readout_tokens |" in out and "| hla_walk |" not in out
    assert hla_module.chunk_gates is originals[(hla_module, "chunk_gates")]
    assert chunk_module.hla_walk is originals[(chunk_module, "hla_walk")]
