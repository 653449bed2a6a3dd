#!/usr/bin/env bash
# Wan2.1-T2V-1.3B fine-tuning from YAML on H200s, on data made here (no download): a random-weight pipeline
# folder in Wan2.1-T2V-1.3B-Diffusers' layout (the real transformer and VAE architectures, a one-layer UMT5 of
# UMT5-XXL's width in place of the 5.7B-parameter encoder) and random encoded clips at the real token counts,
# 81 frames at 480x832 (21 x 30 x 52 = 32,760 tokens) and 720x1280 (21 x 45 x 80 = 75,600). The configs run
# unchanged but for paths: configs/train/wan2.1-1.3b-{mhla,hybrid,sdpa}-finetune.yaml.
#
# Usage (repository root, on the GPU machine): bash benchmarks/wan2.1_finetune_gpu.sh PART OUT
#   setup       the stand-in pipeline and the clips under $DATA (default /tmp/wan-data; about 7 GB)
#   estimate    parameters of each variant (meta device) and the memory estimate below
#   one_gpu_480p, one_gpu_720p   10 steps per variant on one H200, batch 1: peak GiB (s/step in metrics.jsonl);
#               COMPILE=true: the same compiled, each block its own graph as the configs set it (files
#               ...-compiled-blocks; COMPILE_SCOPE=model: the whole model one graph, ...-compiled); VARIANTS: which of
#               "sdpa mhla hybrid" (all three unless set)
#   profile_480p, profile_720p   where a step's time goes per variant (benchmarks/train_step_profile.py: attention,
#               matmuls, norms, optimizer, other, host wait), steps 3-5 profiled; COMPILE and VARIANTS as above
#   resume      the all-MHLA config at 480p for STEPS (200) steps, a checkpoint every STEPS/2: once uninterrupted, once
#               SIGKILLed after its first checkpoint and run again (the same command resumes); the losses compared
#   two_gpu_eq  1 vs 2 GPUs (DDP) at equal global batch in fp32: the loss curves must match
#   two_gpu_mem DDP and FSDP on 2 GPUs, batch 2: peak GiB per process
#   sp          the all-MHLA config sequence-parallel on 2 GPUs (blocks 2 x 5 x 10) against 1 GPU
# Each step is time-boxed to fit one 10-minute command. A part writes a file per run into OUT, more than a device
# call brings back (8 files): give it a folder under the call's $OUT and pack that into one tarball before the call
# ends. On a CPU, `accelerate launch --cpu --num_processes 2` starts ONE process (accelerate's multi-CPU launch goes
# through mpirun): launch with --multi_gpu, as below (tests/test_training_ddp.py does so on 2 CPU processes).
#
# Memory per GPU, estimated (one process, micro-batch 1, bf16 autocast over fp32 master weights, AdamW,
# gradient checkpointing of every transformer block). P = 1,418,996,800 (sdpa), 1,419,717,880 (mhla: Mc and
# out-norm add 0.05%), 1,419,477,520 (hybrid).
#   weights 4P + gradients 4P + AdamW moments 8P      22.7 GB   (DDP on 2+ GPUs: + gradient buckets, 4P = 5.7 GB)
#   UMT5-XXL encoder (5,680,910,336 params) on the GPU 11.4 GB in bf16 (22.7 GB in fp32); the stand-in's: 0.8 GB
#   Wan VAE (126,892,531 params, fp32)                  0.5 GB
#   block inputs kept by checkpointing, N x 1536 bf16 x 30 blocks      3.0 GB at 480p, 7.0 GB at 720p
#   one block recomputed and differentiated, ~200 KB per token          6.5 GB at 480p, 15 GB at 720p
#   total                                               ~45 GB at 480p, ~58 GB at 720p: one H200 (141 GB) holds either
# Without checkpointing every block keeps ~100 KB per token: ~100 GB more at 480p, ~230 GB at 720p (does not fit).
# The activation terms are estimates (per-token counts of a Wan block's tensors); one_gpu_* measure the peaks.
set -u
part=$1; out=$2
mkdir -p "$out"
DATA=${DATA:-/tmp/wan-data}
RUN_FILTER="peak_gib|trained to|parameters|relative difference|wrote|_ms_per_step|Error|error" RUN_LINES=12
. "$(dirname "$0")/gpu_env.sh"  # exports, wheels, run NAME SECONDS CMD...
# training with the peak GPU memory of each process printed at the end (torch.cuda.max_memory_allocated)
PEAK=$out/train_with_peak.py
cat > "$PEAK" <<'EOF'
import sys, torch
from mediagen.training import load_config
from mediagen.training.trainer import train
result = train(load_config(sys.argv[1], sys.argv[2:]))
steps = sorted(result["losses"])
print(f"peak_gib {torch.cuda.max_memory_allocated() / 2**30:.2f} reserved_gib "
      f"{torch.cuda.max_memory_reserved() / 2**30:.2f} steps {steps[0]}-{steps[-1]} "
      f"loss {result['losses'][steps[-1]]:.4f}")
EOF
CFG=configs/train/wan2.1-1.3b
# Runs write under $WORK (a 1.3B checkpoint with AdamW state is 17 GB, written at a run's last step); only their
# metrics.jsonl is kept, as $out/metrics-NAME.jsonl, and the folder removed
WORK=${WORK:-/tmp/wan-runs}
keep_metrics() { cp "$1/metrics.jsonl" "$out/metrics-$2.jsonl" 2>/dev/null; rm -rf "$1"; }
# what the synthetic runs change in the configs: where the model and the clips are, how long, no samples/checkpoints
SYN=(model.pretrained=$DATA/wan-stand-in data.dataset=latent-cache data.num_workers=2 train.max_steps=10
     train.batch_size=1 train.micro_batch_size=1 optim.warmup_steps=0 checkpoint.every=100000 checkpoint.resume=null
     checkpoint.save_pipeline=false overwrite_output_dir=true logging.sample_every=0
     logging.progress=false train.compile=${COMPILE:-false} train.compile_scope=${COMPILE_SCOPE:-blocks})
R480=(data.cache_dir=$DATA/synthetic-480p)
R720=(data.cache_dir=$DATA/synthetic-720p objective.shift=5.0)
case $part in
setup)  # one cache serves the three variants: their text encoder, VAE, seed and text length (the cache key) agree
  run stand_in 300 python3 -m mediagen.training.data.latent_cache stand-in "$DATA/wan-stand-in" --scale wan2.1-1.3b
  run clips_480p 120 python3 -m mediagen.training.data.latent_cache clips $CFG-mhla-finetune.yaml \
    model.pretrained=$DATA/wan-stand-in "${R480[@]}" --clips 16 --sizes 81x480x832
  run clips_720p 120 python3 -m mediagen.training.data.latent_cache clips $CFG-mhla-finetune.yaml \
    model.pretrained=$DATA/wan-stand-in data.cache_dir=$DATA/synthetic-720p --clips 16 --sizes 81x720x1280
  ;;
estimate)
  run estimate 120 python3 - <<'EOF'
import torch
from mediagen import convert
from mediagen.models.presets import build_transformer
for attention in (None, "mhla", "wan-mhla-h"):
    with torch.device("meta"):
        model = build_transformer("wan2.1-1.3b")
    if attention:
        convert(model, attention, blocks=(3, 5, 10), rope="features", out_norm=True)
    p = sum(t.numel() for t in model.parameters())
    print(f"{attention or 'sdpa'}: {p:,} parameters; weights + grads + AdamW {16 * p / 1e9:.1f} GB")
EOF
  ;;
one_gpu_480p|one_gpu_720p)  # about 1 to 2 minutes per run (model load and conversion, then 10 steps)
  size=${part#one_gpu_}
  if [ "$size" = 480p ]; then R=("${R480[@]}"); else R=("${R720[@]}"); fi
  sfx=$([ "${COMPILE:-false}" = true ] && echo -compiled$([ "${COMPILE_SCOPE:-blocks}" = blocks ] && echo -blocks))
  for v in ${VARIANTS:-sdpa mhla hybrid}; do
    run ${v}_$size$sfx $([ -n "$sfx" ] && echo 400 || echo 190) python3 "$PEAK" $CFG-$v-finetune.yaml \
      output_dir=$WORK/$v-$size "${SYN[@]}" "${R[@]}"
    keep_metrics $WORK/$v-$size $v-$size$sfx
  done
  ;;
profile_480p|profile_720p)
  size=${part#profile_}
  if [ "$size" = 480p ]; then R=("${R480[@]}"); else R=("${R720[@]}"); fi
  sfx=$([ "${COMPILE:-false}" = true ] && echo -compiled$([ "${COMPILE_SCOPE:-blocks}" = blocks ] && echo -blocks))
  for v in ${VARIANTS:-sdpa mhla hybrid}; do
    run profile_${v}_$size$sfx 400 python3 -m benchmarks train_step_profile $CFG-$v-finetune.yaml \
      output_dir=$WORK/profile-$v-$size "${SYN[@]}" "${R[@]}" --warmup 2 --steps 3 --out $out/profile-$v-$size$sfx.json
    rm -rf $WORK/profile-$v-$size
  done
  ;;
resume)  # a kill -9 loses at most the steps since the last checkpoint; the resumed run's losses are the run's own
  # time boxes follow STEPS: ~1.1 s a step at 480p on an H100, up to 2 s beside other work, and two 17 GB saves
  steps=${STEPS:-200}; every=$((steps / 2)); box=$((steps * 2 + 240))
  RES=("${SYN[@]}" "${R480[@]}" train.max_steps=$steps checkpoint.every=$every checkpoint.keep_last=1
       checkpoint.resume=latest overwrite_output_dir=false logging.every=1)
  run resume_ref $box python3 "$PEAK" $CFG-mhla-finetune.yaml output_dir=$WORK/ref "${RES[@]}"
  keep_metrics $WORK/ref resume-ref
  killed=$WORK/killed; rm -rf "$killed"; mkdir -p "$killed"
  setsid python3 "$PEAK" $CFG-mhla-finetune.yaml output_dir=$killed "${RES[@]}" > "$out/resume_killed.txt" 2>&1 &
  pid=$!; t=0
  until ls "$killed"/checkpoints/*"$every"* > /dev/null 2>&1 || [ $t -ge $((box / 2 + 60)) ]; do sleep 2; t=$((t + 2)); done
  sleep 5; kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  echo "=== killed after $(python3 -c "import json,sys; print(max(json.loads(l)['step'] for l in open(sys.argv[1])))" \
    "$killed/metrics.jsonl") steps; checkpoints: $(ls "$killed/checkpoints" | tr '\n' ' ')"
  run resume_again $box python3 "$PEAK" $CFG-mhla-finetune.yaml output_dir=$killed "${RES[@]}"
  keep_metrics $killed resume-killed
  run resume_compare 30 python3 benchmarks/compare_loss_curves.py $out/metrics-resume-ref.jsonl \
    $out/metrics-resume-killed.jsonl
  ;;
two_gpu_eq)  # fp32 and no TF32, so that the only difference between 1 and 2 processes is summation order
  export NVIDIA_TF32_OVERRIDE=0
  EQ=("${SYN[@]}" "${R480[@]}" train.max_steps=5 train.batch_size=2 train.mixed_precision=no)
  run eq_1gpu 270 accelerate launch --num_processes 1 "$PEAK" $CFG-mhla-finetune.yaml \
    output_dir=$WORK/eq1 "${EQ[@]}"
  run eq_2gpu 270 accelerate launch --multi_gpu --num_processes 2 "$PEAK" $CFG-mhla-finetune.yaml \
    output_dir=$WORK/eq2 "${EQ[@]}"
  keep_metrics $WORK/eq1 eq1; keep_metrics $WORK/eq2 eq2
  run eq_compare 30 python3 benchmarks/compare_loss_curves.py $out/metrics-eq1.jsonl $out/metrics-eq2.jsonl
  ;;
two_gpu_mem)
  run ddp_2gpu_480p 280 accelerate launch --multi_gpu --num_processes 2 "$PEAK" $CFG-mhla-finetune.yaml \
    output_dir=$WORK/ddp "${SYN[@]}" "${R480[@]}" train.batch_size=2
  run fsdp_2gpu_480p 280 accelerate launch --multi_gpu --num_processes 2 "$PEAK" $CFG-mhla-finetune.yaml \
    output_dir=$WORK/fsdp "${SYN[@]}" "${R480[@]}" train.batch_size=2 train.distributed=fsdp
  keep_metrics $WORK/ddp ddp; keep_metrics $WORK/fsdp fsdp
  ;;
sp)  # each GPU holds half of every clip's tokens (whole MHLA blocks along the frames)
  run sp_1gpu 270 python3 "$PEAK" $CFG-mhla-finetune.yaml output_dir=$WORK/sp1 "${SYN[@]}" "${R720[@]}" \
    'model.blocks=[2,5,10]' train.max_steps=5
  run sp_2gpu 270 accelerate launch --multi_gpu --num_processes 2 "$PEAK" $CFG-mhla-finetune.yaml \
    output_dir=$WORK/sp2 "${SYN[@]}" "${R720[@]}" 'model.blocks=[2,5,10]' train.max_steps=5 \
    train.sequence_parallel=true
  keep_metrics $WORK/sp1 sp1; keep_metrics $WORK/sp2 sp2
  run sp_compare 30 python3 benchmarks/compare_loss_curves.py $out/metrics-sp1.jsonl $out/metrics-sp2.jsonl
  ;;
*) echo "unknown part $part: use setup|estimate|one_gpu_480p|one_gpu_720p|profile_480p|profile_720p|resume|two_gpu_eq|two_gpu_mem|sp"; exit 2 ;;
esac
