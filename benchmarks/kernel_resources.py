"""Registers, spills and shared memory of each MHLA Triton kernel at its shipped launch settings,
compiled for Hopper (sm_90a) on any machine: no GPU needed, Triton's own ptxas reports them.

    python -m benchmarks kernel_resources [--head-dim 128] [--kernels summary,query_grad]
    python -m benchmarks kernel_resources --head-dim 256 --dense-variants   # every dense-kernel tiling
    python -m benchmarks kernel_resources --head-dim 256 --fp32-rope        # the largest chunked tiles
    python -m benchmarks kernel_resources --head-dim 72 --fp32              # fp32 inputs (exact fp32 dots)

The last column counts global loads and stores that move one 2-byte element per instruction (from the
PTX): a tile row that the compiler cannot prove 16-byte aligned is moved that way. Token tensors are laid
out as a launch at DiT-XL/2 512 px would pass them (contiguous (8, 1024, 16, D)): their strides divided as
the launcher divides them (launches.stride_unit), which is what decides that alignment at D = 72.

Occupancy bounds what a memory-bound kernel can keep in flight: an H100/H200 multiprocessor has
65,536 registers and 227 KiB of shared memory, so a program of W warps using R registers per thread
fits floor(65536 / (32 * W * R)) times by registers. The CTAs-per-SM column is the smaller of the
register and shared-memory bounds (the hardware's own limits on warps and blocks are not reached).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.common import markdown_table
from mediagen.kernels.mhla import launches as op_launches, tiles as op_tiles
from mediagen.kernels.mhla.settings import current_settings
from mediagen.kernels.mhla.triton_chunked import (apply_kernel, key_grad_kernel, query_grad_kernel,
                                                  summary_kernel)
from mediagen.kernels.mhla.triton_dense import dense_forward_kernel
from mediagen.kernels.mhla.triton_dense_grad import dense_key_grad_kernel, dense_query_grad_kernel

REGISTERS_PER_SM, SMEM_PER_SM = 65536, 227 * 1024
# pointer arguments and their element types for bf16 inputs in training: the summaries, mixed or not,
# and their gradients are fp32 whenever a backward reads them (tiles.summary_dtype; a bf16 forward
# that nothing differentiates stores them in bf16)
POINTERS = {"Q": "bf16", "K": "bf16", "V": "bf16", "O": "bf16", "G": "bf16", "DQ": "bf16", "DK": "bf16", "DV": "bf16",
            "SZ": "fp32", "SZM": "fp32", "DSZ": "fp32", "COS": "fp32", "SIN": "fp32", "MIX": "fp32", "BLK": "i32",
            "INV": "fp32", "LO": "bf16", "GO": "fp32", "DMIX": "fp32", "CW": "bf16", "CB": "bf16",
            "order": "i32", "offsets": "i32"}
FLOATS = {"eps", "scale"}
KERNELS = ("summary", "apply", "query_grad", "key_grad", "dense", "dense_query_grad", "dense_key_grad")
UNIT_STRIDES = {"sqd", "skd", "svd", "sod", "sgd", "sdd", "sdkd", "sdvd"}  # the head dim is contiguous


def compile_report(fn, constexprs: dict, warps: int, stages: int, pointers: dict | None = None) -> dict:
    """Compile ``fn`` for sm_90a as a launch on contiguous bf16 tensors would (16-divisible pointers and
    strides, unit last-dim strides) and return its registers, spilled bytes and shared memory.
    ``constexprs`` may also give the launch value of a run-time int (the summary row length X).
    ``pointers`` overrides element types of POINTERS (fp32 inputs, say)."""
    types = {**POINTERS, **(pointers or {})}
    consts = dict(constexprs)
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts and not fn.params[i].is_constexpr:
            # a run-time int with its launch value: Triton's launcher marks it 16-divisible only when it is
            sig[name] = "i32"
            if consts.pop(name) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in consts:
            sig[name] = "constexpr"
        elif name in UNIT_STRIDES:
            consts[name] = 1
            sig[name] = "constexpr"
        elif name in types:
            sig[name] = "*" + types[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("s"):  # strides of (B, N, H, D) tensors and of the angle tables
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        proc = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            name = getattr(fn, "__name__", fn)
            raise RuntimeError(f"{ptxas} exited with {proc.returncode} on {name}: {proc.stderr.strip()[-800:]}")
        log = proc.stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spill = re.search(r"(\d+) bytes spill stores", log)
    smem = kernel.metadata.shared
    by_regs = REGISTERS_PER_SM // (32 * warps * regs)
    by_smem = SMEM_PER_SM // smem if smem else by_regs
    # global loads and stores of one 2-byte element per instruction: a row that could not be proven 16-byte
    # aligned (a run-time length not divisible by 16, such as the summary rows' D*D + D at D = 72)
    narrow = len(re.findall(r"\b(?:ld|st)\.global(?:\.\w+)*\.[bu]16\b", kernel.asm["ptx"]))
    return dict(registers=regs, spill_bytes=int(spill.group(1)) if spill else 0, shared_bytes=smem, narrow=narrow,
                warps=warps, stages=stages, ctas_per_sm=min(by_regs, by_smem))


def row_stride_args(fn, D: int) -> dict:
    """AL and the launch values of ``fn``'s batch, token and head strides of token tensors (sqb, skn, sdvh, ...)
    for contiguous (8, 1024, 16, D) tensors, divided by AL as the launcher passes them."""
    t = torch.empty((8, 1024, 16, D), device="meta")
    al = op_launches.stride_unit(t)
    strides = dict(zip("bnh", op_launches.row_strides(t, al)))
    out = {"AL": al}
    for name in fn.arg_names:
        if re.fullmatch(r"s(q|k|v|o|g|d|dk|dv)[bnh]", name):
            out[name] = strides[name[-1]]
    return out


def chunked_constexprs(name, D, fp32=False, rope=False, **extra):
    """(constexprs, warps, stages) of a chunked kernel as its launcher would launch it: fp32 inputs
    multiply exactly (IEEE dots), and with RoPE too they take the smaller fp32-with-RoPE tiles."""
    BD, TILE, BT, warps, stages = op_tiles._config(name, D, fp32 and rope, fp32=fp32)
    fn = {"summary": summary_kernel, "apply": apply_kernel, "query_grad": query_grad_kernel,
          "key_grad": key_grad_kernel}[name]
    c = dict(D=D, X=D * D + D, BD=BD, TILE=TILE, BT=BT, FEATURE=1, IEEE=fp32, ROPE=rope, PREFETCH=op_tiles._prefetch(name),
             **extra, **row_stride_args(fn, D))
    return c, warps, stages


def reports(D: int, only=(), fp32=False, rope=False):
    """{kernel name: report} at head dim D, ReLU features, normalised: bf16 or (``fp32``) fp32 inputs,
    with or without RoPE. fp32 with RoPE gives the chunked kernels their largest tiles."""
    lowp = not fp32
    io = {name: "fp32" for name, t in POINTERS.items() if t == "bf16"} if fp32 else None
    dtype = torch.float32 if fp32 else torch.bfloat16
    plans = {
        "summary": (summary_kernel, chunked_constexprs("summary", D, fp32, rope, DOT_F32=fp32), io),
        "apply": (apply_kernel, chunked_constexprs("apply", D, fp32, rope, NORMALIZE=True, LOWP=lowp), io),
        "query_grad": (query_grad_kernel, chunked_constexprs("query_grad", D, fp32, rope, NORMALIZE=True, LOWP=lowp),
                       io),
        "key_grad": (key_grad_kernel, chunked_constexprs("key_grad", D, fp32, rope, LOWP=lowp), io),
        "dense": (dense_forward_kernel, dense_constexprs(D, dtype, rope=rope, normalize=True), io),
        "dense_query_grad": (dense_query_grad_kernel, dense_grad_constexprs(dense_query_grad_kernel, D, dtype), io),
        "dense_key_grad": (dense_key_grad_kernel, dense_grad_constexprs(dense_key_grad_kernel, D, dtype), io),
    }
    out = {}
    for name, (fn, (consts, warps, stages), pointers) in plans.items():
        if only and name not in only:
            continue
        out[name] = compile_report(fn, consts, warps, stages, pointers)
    return out


def dense_constexprs(D, dtype, rope, normalize):
    """(constexprs, warps, stages) of the dense kernel as ``launch_dense`` would launch it."""
    f32 = dtype == torch.float32
    tiles = op_tiles.dense_settings(D, dtype, rope, normalize)
    warps, stages = tiles.pop("warps"), tiles.pop("stages")
    consts = dict(D=D, BM=16, ONEHOT=True, FEATURE=1, NORMALIZE=normalize, DOT_F32=f32, IEEE=f32, ROPE=rope, **tiles,
                  SAVE=False, LO_PART=False, CK0=0, CK1=1, CK2=1, CPE_BIAS=False,
                  TAIL=0, **row_stride_args(dense_forward_kernel, D))
    return consts, warps, stages


def dense_grad_constexprs(fn, D, dtype):
    """(constexprs, warps, stages) of a dense backward kernel as ``_dense_grad_launch`` would launch it (no RoPE:
    the dense backward never has it), normalised."""
    f32 = dtype == torch.float32
    tiles = op_tiles.dense_grad_tiles(current_settings(), D, dtype)
    warps, stages = tiles.pop("warps"), tiles.pop("stages")
    consts = dict(D=D, BM=16, FEATURE=1, NORMALIZE=True, DOT_F32=f32, IEEE=f32, **tiles, TAIL=0,
                  **row_stride_args(fn, D))
    if fn is dense_query_grad_kernel:
        consts["LO_PART"] = not f32
    return consts, warps, stages


def dense_variants(D):
    """{(dtype, rope, normalize): report} of the dense kernel over the inputs that change its tiles."""
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        element = "fp32" if dtype == torch.float32 else "bf16"
        io = {name: element for name in ("Q", "K", "V", "O")}
        for rope in (False, True):
            for normalize in (True, False):
                consts, warps, stages = dense_constexprs(D, dtype, rope, normalize)
                out[(element, rope, normalize)] = compile_report(dense_forward_kernel, consts, warps, stages, io)
    return out


def main():
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("kernel_resources.py compiles the kernels: unset TRITON_INTERPRET (the interpreter's kernels "
                 "cannot be compiled)")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--kernels", default="", help=f"comma list of {', '.join(KERNELS)}")
    ap.add_argument("--fp32-rope", action="store_true",
                    help="fp32 inputs with RoPE (the largest tiles) instead of bf16 inputs without")
    ap.add_argument("--fp32", action="store_true", help="fp32 inputs without RoPE (exact fp32 products)")
    ap.add_argument("--dense-variants", action="store_true",
                    help="the dense kernel only, for bf16 and fp32 inputs, with and without RoPE and normalisation")
    args = ap.parse_args()
    if not 16 <= args.head_dim <= 256:
        ap.error(f"--head-dim={args.head_dim} is not allowed: the MHLA kernels take head dims from 16 to 256")
    only = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(only) - set(KERNELS))
    if unknown:
        ap.error(f"--kernels names unknown kernels {unknown}: choose from {', '.join(KERNELS)}")
    if args.dense_variants:
        print(f"triton {triton.__version__}, sm_90a, dense kernel, head dim {args.head_dim}\n")
        rows = [[*variant, r["registers"], r["spill_bytes"], f"{r['shared_bytes'] / 1024:.1f}", r["ctas_per_sm"]]
                for variant, r in dense_variants(args.head_dim).items()]
        print(markdown_table(["inputs", "rope", "normalize", "registers", "spilled bytes", "shared KiB", "CTAs per SM"],
                             rows))
        return
    if args.fp32 and args.fp32_rope:
        ap.error("--fp32 and --fp32-rope: give one (--fp32 is fp32 inputs without RoPE)")
    fp32 = args.fp32 or args.fp32_rope
    inputs = "fp32 inputs with RoPE" if args.fp32_rope else "fp32 inputs" if args.fp32 else "bf16 inputs"
    print(f"triton {triton.__version__}, sm_90a, head dim {args.head_dim}, {inputs}\n")
    rows = [[name, r["warps"], r["stages"], r["registers"], r["spill_bytes"], f"{r['shared_bytes'] / 1024:.1f}",
             r["ctas_per_sm"], r["narrow"]] for name, r in reports(args.head_dim, only, fp32, rope=args.fp32_rope).items()]
    print(markdown_table(["kernel", "warps", "stages", "registers", "spilled bytes", "shared KiB", "CTAs per SM",
                          "2-byte global accesses"], rows))


if __name__ == "__main__":
    main()
