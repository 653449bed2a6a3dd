#!/usr/bin/env bash
# One lease on the H200: install the wheels the image lacks, run the GPU tests, then the benchmarks
# (python -m benchmarks NAME; `python -m benchmarks` lists them).
# Usage (repo root, on the GPU machine): bash benchmarks/gpu_session.sh all|kernel_tests|dense_grad_cases|hla|mix|speed|train|dense_grad|shipped OUTDIR
# Each step is time-boxed so that the whole run fits one 10-minute command.
set -u
part=$1; out=$2
mkdir -p "$out"
. "$(dirname "$0")/gpu_env.sh"  # exports, wheels, run NAME SECONDS CMD...
case $part in
all)
  run gpu_tests 80 python3 -m pytest -q tests/test_mhla_triton.py -k "real_sizes or half or alternative or several or compiles or dispatch"
  run attention 190 python3 -m benchmarks attention --out "$out/attention.md"
  run wan_layer 45 python3 -m benchmarks wan_model --skip-model --modes eager
  run wan_model 100 python3 -m benchmarks wan_model --sizes 81x480x832 --modes eager --skip-layer --blocks 3,5,4
  run dit 55 python3 -m benchmarks dit_images --modes eager
  run text 80 python3 -m benchmarks text_encoders --iters 5
  ;;
kernel_tests)  # every kernel's GPU test files whole (no -k selection), as a kernel change needs before it counts
  run mhla_tests 420 python3 -m pytest -q tests/test_mhla_triton.py
  run other_kernel_tests 170 python3 -m pytest -q tests/test_cpe_kernel.py tests/test_kernel_launch.py \
    tests/test_mhla_blocked.py tests/test_hla_triton.py
  ;;
dense_grad_cases)  # the dense backward's half-precision gradients at short sequences, launch variant by variant
  run dense_grad_cases 240 python3 -m benchmarks dense_grad_cases --dtypes bf16,fp16 --seeds 3
  ;;
hla)  # the HLA text-encoder path: GPU tests, one layer stage by stage and per kernel, the encoder under other
      # readout launch settings, whole encoders eager and replayed as CUDA graphs (about 6 minutes)
  run hla_tests 90 python3 -m pytest -q tests/test_hla_triton.py tests/test_hla.py
  run hla_profile 90 python3 -m benchmarks profile_hla --tokens 32768 --kernels
  run hla_profile_top8c 60 python3 -m benchmarks profile_hla --tokens 32768 --top-k 8 --route chunk
  run hla_readout_sweep 100 python3 -m benchmarks text_encoders --only encode --attentions hla --lengths 32768 \
    --batches 16 --warmup 1 --iters 3 --readout BT64=64,128,256 warps=4,8 stages=2,3
  run hla_encode 120 python3 -m benchmarks text_encoders --only encode --attentions sdpa hla hla-top8c \
    --lengths 4096 32768 --batches 1 16 --iters 5 --graph --out "$out/encode.md"
  ;;
mix)  # the block-mixing kernels: GPU tests, the op under the mix kernel's settings (column widths, programs per
      # SM, bf16 products) and mix_grad's, then the op at Wan 480p beside cuDNN (about 8 minutes)
  run mix_tests 90 python3 -m pytest -q tests/test_mhla_triton.py -k "mix or real_sizes"
  run mix_sweep 270 python3 -m benchmarks attention --no-backward --shapes "DiT-XL/2 512,SANA,Wan2.1-1.3B 81f 480x832" \
    --sweep mix BX=64,128,256 per_sm=2,4,8 warps=4,8 stages=3,4 lowp=true,false --out "$out/mix_sweep.md"
  run mix_grad_sweep 90 python3 -m benchmarks attention --shapes "DiT-XL/2 512,Wan2.1-1.3B 81f 480x832" \
    --sweep mix_grad XT=256,512,1024 BK=32,64 sum=torch,triton --out "$out/mix_grad_sweep.md"
  run attention_wan 60 python3 -m benchmarks attention --methods "mhla triton,sdpa cudnn" \
    --shapes "Wan2.1-1.3B 81f 480x832" --out "$out/attention.md"
  ;;
speed)  # the eager-speed targets: bf16 gradients against fp64, text encoders at prompt lengths (short paths
        # against the long ones), the pipelines' runtimes, the op beside cuDNN at DiT-XL/2 256 px and Wan 480p
        # (eager against CUDA graph: the host's time), about 8 minutes
  run speed_tests 150 python3 -m pytest -q tests/test_mhla_triton.py tests/test_pipelines_runtime.py \
    -k "random_sweep or two_parts or real_sizes or bf16_on_a_gpu or matches_eager"
  run text_short 120 python3 -m benchmarks text_encoders --only encode --lengths 77 512 32768 --batches 1 16 \
    --iters 20 --attentions sdpa mlra2 mlra2-long mlra4 mlra4-long hla hla-long --graph --out "$out/encode.md"
  run attention_speed 90 python3 -m benchmarks attention --methods "mhla triton,sdpa cudnn" \
    --shapes "DiT-XL/2 256,Wan2.1-1.3B 81f 480x832" --out "$out/attention.md"
  run dit_speed 100 python3 -m benchmarks dit_images --presets dit-xl-2-256 --modes eager,compile
  ;;
train)  # the training path: the dense backward's GPU tests, the op's forward + backward by algorithm beside SDPA
        # at DiT-XL/2 256 px (B = 8 and 64), the DiT-XL/2 256 px training step eager and compiled (about 8 minutes)
  run train_tests 150 python3 -m pytest -q tests/test_mhla_triton.py \
    -k "half_precision or (sweep and dtype2) or either_backward or later_calls or custom_op or reads_what"
  run train_attention 90 python3 -m benchmarks attention --shapes "DiT-XL/2 256" --batches 8,64 \
    --methods "mhla triton,sdpa" --out "$out/train_attention.md"
  run dit_train 180 python3 -m benchmarks dit_images --train --presets dit-xl-2-256 --batch 64 --modes eager,compile \
    --variants sdpa,mhla
  ;;
dense_grad)  # the dense backward's launch settings at DiT-XL/2 256 px (B = 8 and 64), the op's forward + backward
            # there beside SDPA, and its bf16 gradients against fp64 (the GPU tests)
  run dense_grad_sweep 330 python3 -m benchmarks attention --shapes "DiT-XL/2 256" --batches 8,64 \
    --methods "mhla triton dense" --sweep dense_grad BT=32,64,128 BS=32,64,128 warps=4,8 stages=1,2,3 \
    --out "$out/dense_grad_sweep.md"
  run train_attention 90 python3 -m benchmarks attention --shapes "DiT-XL/2 256" --batches 8,64 \
    --methods "mhla triton,sdpa" --out "$out/train_attention.md"
  run dense_grad_tests 120 python3 -m pytest -q tests/test_mhla_triton.py -k "half_precision or either_backward"
  ;;
shipped)  # the shipped MNIST models on the GPU: the dense forward's and the CPE's GPU tests, the dense forward's
          # tiles at their shapes (rows not filled, the short variant off, beside SDPA), image sampling under
          # CUDA graphs (about 8 minutes)
  run shipped_tests 150 python3 -m pytest -q tests/test_mhla_triton.py tests/test_cpe_kernel.py -k "dense or fill or cpe"
  run dense_shipped 180 python3 -m benchmarks attention --no-backward --shapes "image 14x14,video" --batches 2,8 \
    --methods "mhla triton dense,sdpa cudnn,sdpa flash" \
    --sweep dense BT=16,32,64,128,256 BS=32,64 warps=2,4,8 stages=2 fill=false short_tokens=0 \
    --out "$out/dense_shipped.md"
  run image_graphs 120 python3 -m benchmarks image_latency --device cuda --dtype bf16 --batches 1 64 \
    --runtime cuda-graphs --rounds 4 --models image-sdpa image-mhla
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
