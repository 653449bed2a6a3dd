"""benchmarks/kernel_resources.py compiles the MHLA kernels for sm_90a without a GPU (in a process
without Triton's interpreter) and reads ptxas's register and spill counts."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(*args, interpret=False):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "benchmarks", "kernel_resources", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def kernel_rows(stdout):
    """(kernel, warps, stages, registers, spilled bytes, shared KiB, CTAs per SM, 2-byte global accesses) rows
    of the report."""
    return re.findall(r"^\| (\w+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \| (\d+) \| (\d+) \|$", stdout,
                      re.M)


def test_reports_registers_shared_memory_and_occupancy():
    proc = run("--head-dim", "32", "--kernels", "apply,key_grad")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = kernel_rows(proc.stdout)
    assert [r[0] for r in rows] == ["apply", "key_grad"]
    for name, warps, stages, regs, spill, smem_kib, ctas, narrow in rows:
        warps, regs, ctas = int(warps), int(regs), int(ctas)
        assert 16 <= regs <= 255 and int(spill) >= 0 and 0 < float(smem_kib) <= 227, name
        assert 1 <= ctas <= 65536 // (32 * warps * regs), name


def test_rows_move_in_16_byte_accesses_at_head_dim_72():
    """DiT's head dim 72 makes two lengths that Triton's launcher does not mark 16-divisible: a summary row,
    D*D + D = 5,256 elements, and the head stride of q, k, v and o, 72. Passed as run-time ints, the kernels
    then moved S~ / dS rows and every token row element by element (apply: 129 2-byte accesses per thread,
    key_grad 257, the dense kernel 180). The row length is a compile-time constant and the strides arrive
    divided by a compile-time unit (launches.stride_unit): what is left are the z / den vectors, one to
    three accesses. (The summary kernel writes its rows in 2-byte stores on purpose, triton_chunked.py
    says why.)"""
    proc = run("--head-dim", "72", "--kernels", "apply,query_grad,key_grad,dense")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = kernel_rows(proc.stdout)
    assert [r[0] for r in rows] == ["apply", "query_grad", "key_grad", "dense"]
    for row in rows:
        assert int(row[-1]) <= 3, row


def test_refuses_the_interpreter():
    proc = run("--kernels", "apply", interpret=True)
    assert proc.returncode != 0 and "unset TRITON_INTERPRET" in proc.stderr


def test_dense_kernel_tilings_fit_shared_memory():
    """Every tiling the dense kernel's launcher picks at the widest head dim (256: bf16 and fp32, with and
    without RoPE and normalisation) fits a Hopper multiprocessor's shared memory; fp32 with RoPE once
    asked for 234 KiB there."""
    proc = run("--head-dim", "256", "--dense-variants")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = re.findall(r"^\| (bf16|fp32) \| (True|False) \| (True|False) \| (\d+) \| (\d+) \| ([\d.]+) \| (\d+) \|$",
                      proc.stdout, re.M)
    assert len(rows) == 8
    for element, rope, normalize, regs, spill, smem_kib, ctas in rows:
        assert float(smem_kib) <= 227 and int(ctas) >= 1, (element, rope, normalize, smem_kib)


@pytest.mark.parametrize("args, inputs", [
    # fp32 inputs with RoPE at D = 256 give the chunked kernels their largest tiles; key_grad's 32-token
    # steps once asked for 256 KiB there (an OutOfResources on the H200)
    (("--head-dim", "256", "--fp32-rope"), "head dim 256, fp32 inputs with RoPE\n"),
    # fp32 inputs without RoPE multiply exactly (IEEE dots) at the bf16 tiles, at DiT's head dim
    (("--head-dim", "72", "--fp32"), "head dim 72, fp32 inputs\n"),
])
def test_chunked_kernels_fit_shared_memory_with_fp32_inputs(args, inputs):
    proc = run(*args, "--kernels", "summary,apply,query_grad,key_grad")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert inputs in proc.stdout
    rows = kernel_rows(proc.stdout)
    assert [r[0] for r in rows] == ["summary", "apply", "query_grad", "key_grad"]
    for name, warps, stages, regs, spill, smem_kib, ctas, narrow in rows:
        assert float(smem_kib) <= 227 and int(ctas) >= 1, (name, smem_kib)


def test_rejects_unknown_kernels_and_head_dims():
    proc = run("--kernels", "apply,softmax")
    assert proc.returncode == 2 and "unknown kernels ['softmax']" in proc.stderr
    proc = run("--head-dim", "512")
    assert proc.returncode == 2 and "--head-dim=512 is not allowed" in proc.stderr
    proc = run("--fp32", "--fp32-rope")
    assert proc.returncode == 2 and "--fp32 and --fp32-rope: give one" in proc.stderr



def test_the_dense_backward_fits_shared_memory_at_head_dim_256_in_fp32():
    """With fp32 tiles of 256 columns, 32 rows and 32 per step in 3 stages, the dense backward's kernels would need
    237,824 and 240,384 bytes of shared memory, more than an H200 has (232,448: out of resources at launch); the
    tiles ``dense_grad_tiles`` gives there fit."""
    proc = run("--head-dim", "256", "--fp32", "--kernels", "dense_query_grad,dense_key_grad")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = kernel_rows(proc.stdout)
    assert [r[0] for r in rows] == ["dense_query_grad", "dense_key_grad"]
    for name, warps, stages, regs, spill, smem_kib, ctas, narrow in rows:
        assert 0 < float(smem_kib) <= 227 and int(ctas) >= 1, name
