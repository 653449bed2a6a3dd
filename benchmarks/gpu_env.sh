# Sourced by the GPU runbooks (gpu_session.sh, wan2.1_finetune_gpu.sh) after they set $out: offline, unbuffered
# Python; the wheels the device image lacks (.whl, from ../shared/tools/gpu-wheels.sh) installed beside it; and
# run NAME SECONDS CMD...: the command time-boxed, its output kept under $out/NAME.txt, the last lines that match
# $RUN_FILTER (every line by default) printed.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PWD:/tmp/site
fi
run() {
  local name=$1 secs=$2; shift 2
  echo "=== $name: $*"
  timeout "$secs" "$@" > "$out/$name.txt" 2>&1; echo "=== $name exit $?"
  grep -v -i -E "warn|^\s*$" "$out/$name.txt" | grep -E "${RUN_FILTER:-.}" | tail -n "${RUN_LINES:-40}"
}
