"""benchmarks/sequence_parallel.py end to end on 2 CPU processes (torchrun, gloo, --small): the
sharded results match one rank, and the bytes MHLA sends per layer do not grow with the frame
count while Ulysses' do."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_sequence_parallel_benchmark_smoke_run(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "benchmarks.sequence_parallel", "--backend", "gloo", "--small",
           "--warmup", "0", "--repeats", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "sequence_parallel.json").read_text())
    assert "| MHLA sequence-parallel, 2 ranks |" in (tmp_path / "sequence_parallel.md").read_text()

    checks = result["correctness"]
    assert {c["check"].split(":")[0] for c in checks} >= {
        "MHLA sequence-parallel vs 1 rank", "Ulysses vs unsharded SDPA"}
    assert sum(c["check"].startswith("whole model") for c in checks) == 2
    for c in checks:
        assert c["max_rel_err"] < 1e-4, c

    by_frames = result["bytes_vs_frames"]
    assert [r["frames"] for r in by_frames] == [5, 9, 21]
    assert len({r["mhla_fwd"] for r in by_frames}) == 1 and by_frames[0]["mhla_fwd"] > 0
    assert len({r["mhla_fwd_bwd"] for r in by_frames}) == 1
    assert by_frames[0]["ulysses_fwd"] < by_frames[1]["ulysses_fwd"] < by_frames[2]["ulysses_fwd"]
    # counted from the collectives' tensors: MHLA's all-gather moves each rank's M/P block summaries
    # (B*H*(M/P)*(D*D + D) fp32) once to the other rank
    heads, d, m_local = 2, 16, 8 // 2
    assert by_frames[0]["mhla_fwd"] == heads * m_local * (d * d + d) * 4

    ranks = {r["attention"]: r for r in result["layer"]["rows"]}
    assert ranks["MHLA sequence-parallel, 2 ranks"]["bytes_fwd"] == by_frames[-1]["mhla_fwd"]
    assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in ranks.values())
    model = result["model"]["rows"]
    assert {(r["attention"], r["ranks"]) for r in model} == {("mhla", 1), ("mhla", 2), ("sdpa", 1), ("sdpa", 2)}
    assert all(r["ms"] > 0 for r in model)
