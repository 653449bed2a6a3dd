#!/usr/bin/env bash
# Train the shipped Moving-MNIST text-to-video models (sdpa and mhla side by side on one GPU) within
# one lease of the H200, in calls of at most 10 minutes:
#   bash benchmarks/video_gpu.sh start MINUTES OUT   # install, time 30 steps of each config (eager and
#                                                    # compiled), then start both runs in the background
#   bash benchmarks/video_gpu.sh wait SECONDS OUT    # follow the runs (they train while the machine is held)
#   bash benchmarks/video_gpu.sh finish OUT [ATTN..]  # stop, export the last common step, sample the
#                                                    # 10 digits x 4 directions x 3 seeds grid, time sampling,
#                                                    # pack the fp16 shipped folders into OUT (15 MB parts)
#   bash benchmarks/video_gpu.sh gap STEP OUT        # while training: export every run's checkpoint STEP and
#                                                    # print its caption-direction gap (benchmarks/time_reversal.py;
#                                                    # above 0 once a model reads the caption's direction)
# Long clips (32 frames of 128x128 beside 16 of 64x64; configs/train/wan-mmnist-long-{mhla,sdpa}.yaml), in calls of
# at most 10 minutes; the runbook with the order of the calls is docs/GPU_RUNBOOK.md:
#   bash benchmarks/video_gpu.sh stage NAME OUT      # a call carrying .long/NAME.tar.part-* (weights brought back
#                                                    # from an earlier lease): rebuild the folder /tmp/long/NAME
#   ATTNS="long-mhla long-sdpa" COMPILE=true bash benchmarks/video_gpu.sh start MINUTES OUT   # as above; with
#                                                    # EXTRA="train.max_steps=N" both runs stop at step N (equal clips)
#   ATTNS="long-mhla long-sdpa" bash benchmarks/video_gpu.sh long-export OUT  # stop the runs (SIGTERM: each writes a
#                                                    # checkpoint), export the last step both saved as fp16 folders
#                                                    # /tmp/runs/ship/video-<name>, pack the first one's 15 MB parts
#   ATTNS="long-mhla long-sdpa" bash benchmarks/video_gpu.sh long-score OUT [SEEDS]  # sample 10 digits x 4 directions x
#                                                    # SEEDS (10) at 32x128x128 and at 16x64x64 (SIZES="32x128 16x64"),
#                                                    # 8 steps, guidance 4, and score them (mediagen vbench) into OUT;
#                                                    # WORDING=held-out: prompts in wordings never trained on;
#                                                    # FRAMES=1: first / middle / last frames into OUT too;
#                                                    # STEPS=N, GUIDANCE=G: other sampler settings (tagged)
#   bash benchmarks/video_gpu.sh calibrate OUT       # the scorer's calibration rows at both sizes, one and two digits
#   bash benchmarks/video_gpu.sh fetch long-sdpa OUT  # the other exported folder's parts
# Needs .whl (../shared/tools/gpu-wheels.sh) and .minilm-fp16 (benchmarks/export_minilm.py) carried in the lease's
# first call; each call keeps copies under /tmp (wheels installed into /tmp/site, MiniLM in /tmp/minilm-fp16) that
# the later calls of the lease use when they do not carry them (what an earlier call carried may be gone).
# With several GPUs, run i of ATTNS trains on GPU i (mod the count); with one, the runs share it.
# EXTRA holds config overrides for every run and EXTRA_<attention> for one, e.g.
#   EXTRA="data.static_fraction=0.1" EXTRA_mhla="model.attention_options.cpe_kernel=3"
# ATTNS names the runs (default "sdpa mhla"): configs/train/wan-mmnist-<name>.yaml, or configs/train/<name>.yaml,
# e.g. ATTNS=convert-wan-mmnist-mhla for the conversion of video-sdpa (its model.pretrained must be on the machine;
# EXTRA_<name> with - as _, e.g. EXTRA_convert_wan_mmnist_mhla).
# COMPILE=true (or false) skips the throughput timing at start and trains with that setting.
# start records EXTRA and EXTRA_<attention> in /tmp/runs/extra.sh; finish, gap and fetch use them (the
# export has to build the model the run trained).
set -u
phase=$1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -d .minilm-fp16 ] && [ ! -d /tmp/minilm-fp16 ]; then cp -r .minilm-fp16 /tmp/minilm-fp16; fi
[ -d /tmp/minilm-fp16 ] && export MEDIAGEN_MINILM_PATH=/tmp/minilm-fp16
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=$PWD:/tmp/site
MG="python3 -m mediagen.cli"
R=${RUNS:-/tmp/runs}   # the runs, their exports and results (RUNS= elsewhere, e.g. for a try on a CPU)
ATTNS=${ATTNS:-"sdpa mhla"}
mkdir -p $R
if [ "$phase" != start ] && [ -f $R/extra.sh ]; then . $R/extra.sh; fi

config() {  # a run's config: configs/train/wan-mmnist-<name>.yaml, else configs/train/<name>.yaml
  if [ -f configs/train/wan-mmnist-$1.yaml ]; then echo configs/train/wan-mmnist-$1.yaml; else echo configs/train/$1.yaml; fi
}

progress() {  # the last logged step and the median clips/s of the last 20 steps of each run
  for a in $ATTNS; do
    python3 - "$R/wan-mmnist-$a/metrics.jsonl" "$a" <<'PY'
import json, sys, statistics
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except FileNotFoundError:
    print(sys.argv[2], "no metrics yet"); raise SystemExit
last = rows[-20:]
print(f"{sys.argv[2]}: step {rows[-1]['step']} loss(last 20) {statistics.mean(r['loss'] for r in last):.4f} "
      f"clips/s {statistics.median(r['samples_per_s'] for r in last):.0f}")
PY
  done
}

case $phase in
start)
  minutes=$2; out=$3; mkdir -p "$out"
  { printf 'EXTRA=%q\n' "${EXTRA:-}"; for a in $ATTNS; do more="EXTRA_${a//-/_}"; printf '%s=%q\n' "$more" "${!more:-}"; done
  } >> $R/extra.sh   # appended: a run started by a later call keeps the earlier runs' settings
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv
  # throughput of each configuration alone: 30 steps, median of steps 11-30
  for a in $ATTNS; do for c in false true; do
    [ -n "${COMPILE:-}" ] && break 2
    more="EXTRA_${a//-/_}"
    timeout $([ $c = true ] && echo 130 || echo 70) $MG train $(config $a) ${EXTRA:-} ${!more:-} \
      train.max_steps=30 train.compile=$c \
      output_dir=$R/bench-$a-$c checkpoint.every=1000 checkpoint.save_pipeline=false > "$out/bench-$a-$c.log" 2>&1
    python3 - "$R/bench-$a-$c/metrics.jsonl" "$a compile=$c" <<'PY' | tee -a "$out/throughput.txt"
import json, sys, statistics
try:
    rows = [json.loads(l) for l in open(sys.argv[1])][10:]
    print(f"{sys.argv[2]}: {statistics.median(r['samples_per_s'] for r in rows):.0f} clips/s alone (batch 256)")
except Exception as e:
    print(f"{sys.argv[2]}: failed ({e})")
PY
  done; done
  # compiled only when that pays for every attention (>= 10% more clips/s than eager)
  [ -n "${COMPILE:-}" ] || compile=$(python3 - "$out/throughput.txt" <<'PY'
import re, sys
rate = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) compile=(\S+): (\d+) clips/s", line)
    if m:
        rate[m[1], m[2]] = int(m[3])
atts = {a for a, _ in rate}
print("true" if atts and all(rate.get((a, "true"), 0) >= 1.1 * rate.get((a, "false"), 1) for a in atts) else "false")
PY
)
  compile=${COMPILE:-$compile}
  echo "training with train.compile=$compile" | tee -a "$out/throughput.txt"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); gpus=${gpus:-0}; i=0
  for a in $ATTNS; do
    more="EXTRA_${a//-/_}"
    pin=""; [ "$gpus" -gt 1 ] && pin="CUDA_VISIBLE_DEVICES=$((i % gpus))"; i=$((i + 1))
    # the run writes its own process id (bash's, which exec hands to python) for long-export to stop it by
    env $pin setsid nohup bash -c 'echo $$ > "$0"; exec "$@"' $R/pid-$a $MG train $(config $a) ${EXTRA:-} ${!more:-} \
      train.time_limit_minutes=$minutes train.compile=$compile checkpoint.every=${CKPT_EVERY:-250} checkpoint.keep_last=200 \
      output_dir=$R/wan-mmnist-$a > $R/train-$a.log 2>&1 < /dev/null &
  done
  while [ $SECONDS -lt ${HOLD:-540} ]; do sleep 30; done; progress
  ;;
wait)
  secs=$2; out=$3; end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do sleep 60; progress; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
  ;;
finish)
  out=$2
  for a in $ATTNS; do pkill -TERM -f "$(config $a)" || true; done
  sleep 20; progress
  res=$R/results; mkdir -p $res
  for a in $ATTNS; do cp $R/wan-mmnist-$a/metrics.jsonl $res/metrics-$a.jsonl; cp $R/train-$a.log $res/; done
  # the last checkpoint step every run has
  step=$(python3 -m mediagen.training.checkpoint $(for a in $ATTNS; do echo $R/wan-mmnist-$a; done))
  echo "common step: $step"
  ship=$R/ship; mkdir -p $ship
  for a in $ATTNS; do
    more="EXTRA_${a//-/_}"
    $MG train $(config $a) ${EXTRA:-} ${!more:-} output_dir=$R/wan-mmnist-$a --export "$step" --to $R/pipe-$a
    python3 -c "from mediagen.pipelines.shipping import save_shipped_pipeline as s; s('$R/pipe-$a', '$ship/video-$a', text_encoder='minilm')"
  done
  python3 -m benchmarks.video_samples $(for a in $ATTNS; do echo $ship/video-$a; done) --out $res --time-batch 1
  python3 -m benchmarks.video_samples $(for a in $ATTNS; do echo $ship/video-$a; done) --out $R/t40 --time-batch 40 --no-grid
  cp $R/t40/sampling_latency.json $res/sampling_latency_batch40.json
  echo "{\"step\": $step}" > $res/step.json
  tar -czf "$out/results.tar.gz" -C $R results
  # the shipped folders in 15 MB parts (a call brings back 64 MB): the first attention's now,
  # the others with `bash benchmarks/video_gpu.sh fetch ATTN OUT`
  first=${ATTNS%% *}
  tar -cf - -C $ship video-$first | split -b 15m - "$out/video-$first.tar.part-"
  ls -la "$out"
  ;;
gap)
  step=$2
  for a in $ATTNS; do
    more="EXTRA_${a//-/_}"
    $MG train $(config $a) ${EXTRA:-} ${!more:-} output_dir=$R/wan-mmnist-$a --export "$step" \
      --to $R/gap-$a > $R/gap-$a.log 2>&1 || { echo "$a: export of step $step failed:"; tail -n 2 $R/gap-$a.log; }
  done
  python3 -m benchmarks.time_reversal $(for a in $ATTNS; do [ -d $R/gap-$a ] && echo $R/gap-$a; done) --clips 1 \
    --gap-clips 32 2>&1 | grep -E "gap|sigma"
  ;;
fetch)
  tar -cf - -C $R/ship video-$2 | split -b 15m - "$3/video-$2.tar.part-"; ls -la "$3"
  ;;
stage)
  # weights brought back from an earlier lease: .long/NAME.tar.part-* (carried) -> /tmp/long/NAME
  name=$2; mkdir -p /tmp/long
  ls .long/$name.tar.part-* > /dev/null || { echo "stage: carry .long/$name.tar.part-* in this call"; exit 2; }
  cat .long/$name.tar.part-* | tar -xf - -C /tmp/long
  python3 - /tmp/long/$name <<'PY'
import json, sys, pathlib
folder = pathlib.Path(sys.argv[1])
cfg = json.loads((folder / "transformer" / "config.json").read_text())
print(f"{folder}: {cfg['_class_name']}, {sum(f.stat().st_size for f in folder.rglob('*') if f.is_file()) / 1e6:.1f} MB")
PY
  ;;
long-export)
  out=$2; mkdir -p "$out"
  for a in $ATTNS; do   # SIGTERM: the run writes a checkpoint of its last step and exits
    [ -f $R/pid-$a ] && kill -TERM "$(cat $R/pid-$a)" 2>/dev/null || true
  done
  for a in $ATTNS; do
    while [ -f $R/pid-$a ] && kill -0 "$(cat $R/pid-$a)" 2>/dev/null; do sleep 5; done
  done
  progress
  res=$R/results; mkdir -p $res $R/ship
  for a in $ATTNS; do cp $R/wan-mmnist-$a/metrics.jsonl $res/metrics-$a.jsonl; cp $R/train-$a.log $res/; done
  step=$(python3 -m mediagen.training.checkpoint $(for a in $ATTNS; do echo $R/wan-mmnist-$a; done))
  echo "common step: $step" | tee $res/step.txt
  if [ "$step" = 0 ]; then  # equal clips: only a step every run saved is exported
    echo "long-export: no checkpoint step is shared by the runs $ATTNS (a checkpoint every 250 steps, and one where"
    echo "each stopped); export one run alone with ATTNS=<name>, or run on with the same train.max_steps for all"
    exit 2
  fi
  for a in $ATTNS; do
    more="EXTRA_${a//-/_}"
    $MG train $(config $a) ${EXTRA:-} ${!more:-} output_dir=$R/wan-mmnist-$a --export "$step" --to $R/pipe-$a || exit 2
    rm -rf $R/ship/video-$a
    python3 -c "from mediagen.pipelines.shipping import save_shipped_pipeline as s; s('$R/pipe-$a', '$R/ship/video-$a', text_encoder='minilm')"
  done
  tar -czf "$out/results.tar.gz" -C $R results
  first=${ATTNS%% *}
  tar -cf - -C $R/ship video-$first | split -b 15m - "$out/video-$first.tar.part-"
  ls -la "$out"
  ;;
long-score)
  # 10 digits x 4 directions x SEEDS clips per model and size: prompts repeated SEEDS times, 40 a batch, so batch s
  # samples with seed 40 s (mediagen.eval.sampling); each model's folder from long-export
  out=$2; seeds=${3:-10}; mkdir -p "$out"
  # WORDING=held-out: each cell's prompt in a held-out wording (mediagen/training/data/wordings.py, never in
  # training), the wording rotating with the seed, read as typed (--no-rewrite-prompt: the model's own reading);
  # WORDING=two-digit: the cell's digit and direction with a second digit (d + 1 + seed) moving another way;
  # else the training template
  python3 - "$seeds" "${WORDING:-template}" > $R/prompts-grid.txt <<'PY'
import sys
from mediagen.data.captions import template_caption
from mediagen.training.data.wordings import held_out_caption
ways = ("left", "right", "up", "down")
for s in range(int(sys.argv[1])):
    for d in range(10):
        for i, m in enumerate(ways):
            if sys.argv[2] == "held-out":
                print(held_out_caption([d], [m], s + d))
            elif sys.argv[2] == "two-digit":
                print(template_caption([d, (d + 1 + s) % 10], [m, ways[(i + 1 + s) % 4]]))
            else:
                print(template_caption([d], [m]))
PY
  typed=; [ "${WORDING:-}" = held-out ] && typed=--no-rewrite-prompt
  for a in $ATTNS; do
    for size in ${SIZES:-32x128 16x64}; do
      frames=${size%x*}; side=${size#*x}; tag=$a-$size${WORDING:+-$WORDING}${STEPS:+-steps$STEPS}${GUIDANCE:+-g$GUIDANCE}
      # FRAMES=1: also the first / middle / last frame of every clip, OUT/frames-<tag>.npz (a few MB), for
      # python -m benchmarks video_samples_grid
      save=; [ "${FRAMES:-0}" = 1 ] && rm -rf $R/clips-$tag && save="--save-format npy --save-videos $R/clips-$tag"
      $MG vbench --checkpoint $R/ship/video-$a --prompts $R/prompts-grid.txt --num-frames $frames --height $side \
        --width $side --steps ${STEPS:-8} --guidance ${GUIDANCE:-4} --batch-size 40 --background-features pixels --quiet $typed $save \
        --out "$out/vbench-$tag.json" --table "$out/vbench-$tag.md" > /dev/null
      [ -n "$save" ] && python3 -m benchmarks video_samples_grid --pack $R/clips-$tag --clips-per-seed 40 \
        --out "$out/frames-$tag.npz" > /dev/null
      python3 - "$out/vbench-$tag.json" "$a $size ${WORDING:-template} steps ${STEPS:-8} guidance ${GUIDANCE:-4}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["semantic_rates"]
line = f"{sys.argv[2]}: {r['clips']} clips, digit {r['digit']:.3f} direction {r['direction']:.3f} both {r['both']:.3f}"
if "per_digit" in r:  # two-digit prompts: each asked digit's own verdict
    line += " per digit " + " ".join(f"{k} {v:.3f}" for k, v in r["per_digit"].items() if isinstance(v, float))
print(line)
PY
    done
  done | tee -a "$out/scores.txt"
  # one archive of the scores, so that a call's limit on the number of files brought back keeps them
  tar -czf "$out/vbench.tar.gz" -C "$out" $(cd "$out" && ls vbench-*.json vbench-*.md 2>/dev/null)
  ;;
calibrate)
  out=$2; mkdir -p "$out"
  $MG vbench --calibrate --calibrate-size 16x64,32x128 --calibrate-per-cell ${PER_CELL:-3} --calibrate-digits ${DIGITS:-1,2} \
    --out "$out/calibration.json" --table "$out/calibration.md"
  ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
