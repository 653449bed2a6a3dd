#!/usr/bin/env bash
# 1 GPU vs 2 GPUs (DDP through accelerate) at equal global batch: the loss curves must match.
# The global batch of every step is the same set of items on 1 or 2 processes and every sample's
# noise/timestep is seeded by its position in the global batch (mediagen/training/data/sampler.py,
# objectives.py), so the only differences are float reduction order (expect |diff| ~ 1e-6 relative).
#
# Run on the 2-GPU machine from the repository root (install diffusers/omegaconf/accelerate/peft
# wheels first: ../shared/tools/gpu-wheels.sh):
#   bash benchmarks/training_two_gpu.sh [CONFIG] [STEPS]
set -euo pipefail
CONFIG=${1:-configs/train/dit-mnist-mhla.yaml}
STEPS=${2:-200}
OUT=${OUT:-runs/two-gpu-check}
COMMON=(train.max_steps=$STEPS train.batch_size=64 train.micro_batch_size=32 train.mixed_precision=no
        checkpoint.every=100000 checkpoint.resume=null checkpoint.save_pipeline=false logging.sample_every=0
        logging.progress=false data.num_workers=2)
export NVIDIA_TF32_OVERRIDE=0 HF_HUB_OFFLINE=1
rm -rf "$OUT"
# 1 GPU: micro-batch 32, 2 accumulation steps
CUDA_VISIBLE_DEVICES=0 accelerate launch --num_processes 1 -m mediagen.cli train "$CONFIG" output_dir=$OUT/gpu1 "${COMMON[@]}"
# 2 GPUs: micro-batch 32 on each, 1 accumulation step
accelerate launch --multi_gpu --num_processes 2 -m mediagen.cli train "$CONFIG" output_dir=$OUT/gpu2 "${COMMON[@]}"
python benchmarks/compare_loss_curves.py "$OUT/gpu1/metrics.jsonl" "$OUT/gpu2/metrics.jsonl" | tee "$OUT/comparison.txt"
# Real scale: the Wan2.1-T2V-1.3B fine-tunes (configs/train/wan2.1-1.3b-{mhla,hybrid,sdpa}-finetune.yaml), on
# random encoded clips at the real token counts where the checkpoint is not on disk: benchmarks/wan2.1_finetune_gpu.sh
# (memory per GPU, one H200, DDP, FSDP, sequence parallel). With the checkpoint and captioned videos, on 8 GPUs:
#   accelerate launch --multi_gpu --num_processes 8 -m mediagen.cli train configs/train/wan2.1-1.3b-mhla-finetune.yaml \
#     model.pretrained=/data/Wan2.1-T2V-1.3B-Diffusers data.path=/data/videos data.cache_dir=/data/cache/wan2.1
