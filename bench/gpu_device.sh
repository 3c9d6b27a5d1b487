#!/usr/bin/env bash
# Native WebGPU and CUDA on a lent GPU machine, as one script (issue 33): run from the repository root of a
# copy of the checkout, with $OUT the folder whose files come back.
#
# The machine: Python 3.12, torch with CUDA, a CPU-only onnxruntime, no duckdb, Playwright or Chromium. What
# the harness needs beyond that travels as wheels in .whl/ (onnxruntime 1.31.1, onnxruntime-ep-webgpu 0.4.0,
# duckdb, ...), installed into /tmp/site, which PYTHONPATH puts before the machine's own packages.
#
# It says what the machine offers (GPU, Vulkan loader and ICDs, ORT's EP devices), then runs, on bert-tiny
# and llama-tiny, inference and generation:
#   1. --hardware webgpu: ONNX Runtime's WebGPU plugin EP, on the GPU over Vulkan where the machine has a
#      loader and an ICD for it (the rows record the adapter; without one the rows are `unsupported`, saying
#      why: there is no Chromium here to borrow SwiftShader from);
#   2. --hardware cuda with torch, and JAX where its CUDA plugin is installed;
#   3. --hardware cpu with torch and onnxruntime, the baseline the reports' speedups are relative to.
# The store is $OUT/gpu.duckdb, its bundle $OUT/gpu.bundle (`accelharness import $OUT/gpu.bundle` here), the
# reports $OUT/reports, and each step's output $OUT/<step>.log. A failing step is reported and the next runs.
set -u -o pipefail
: "${OUT:?set OUT to the folder whose files come back}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
FAILED=()

step() { # name, command...: run, keep its output in $OUT/name.log, go on whatever it returns
    local name=$1
    shift
    echo "== $name: $*"
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    [ "$rc" -eq 0 ] || { echo "== $name failed (exit $rc)"; FAILED+=("$name"); }
    return 0
}

echo "== python $(python3 --version 2>&1), $(date -u +%FT%TZ)"
if compgen -G ".whl/*.whl" >/dev/null; then
    step wheels pip install -q --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
else
    echo "== no .whl/ folder: the machine's own packages are used"
fi
step install pip install -q --no-index --no-deps --no-build-isolation -e .

# What the machine offers: the GPU, a Vulkan loader and its ICDs (what Dawn needs for a GPU), ORT's EP devices.
echo "== GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 4)"
echo "== Vulkan loader: $( (ldconfig -p 2>/dev/null | grep -m 3 'libvulkan\.so') || echo 'none in ldconfig')"
for folder in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
    [ -d "$folder" ] && echo "== Vulkan ICDs in $folder: $(ls "$folder" | tr '\n' ' ')"
done
echo "== NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-unset} (graphics is what mounts NVIDIA's Vulkan ICD)"
step probe python - <<'EOF'
import json
from harness.native import webgpu_ep
from harness.run.hardware import detect_platforms, machine_probe

for status in detect_platforms(browser=False):  # no Chromium here: the native platforms only
    print(f"{status.platform}: {'yes' if status.available else 'no'}: {status.reason}")
print(json.dumps(machine_probe().discovered, indent=1))
ready = webgpu_ep.setup()
print(json.dumps(ready.facts | {"vulkan_devices_found": ready.vulkan.devices}, indent=1, default=str))
EOF

DB="$OUT/gpu.duckdb"
A=(python -m harness.cli)
COMMON=(--model bert-tiny,llama-tiny --mode inference,generate --iterations 10 --warmup 2 --min-duration 0
    --new-tokens 16 --timeout 300 --db "$DB" --output-dir "$OUT/reports")
CUDA_ENGINES=torch
if python -c "import jax; assert any(d.platform == 'gpu' for d in jax.devices())" 2>/dev/null; then
    CUDA_ENGINES=torch,jax
fi
echo "== cuda engines: $CUDA_ENGINES"

step webgpu "${A[@]}" native --hardware webgpu --engines onnxruntime "${COMMON[@]}"
step cuda "${A[@]}" native --hardware cuda --engines "$CUDA_ENGINES" "${COMMON[@]}"
step cpu "${A[@]}" native --hardware cpu --engines torch,onnxruntime "${COMMON[@]}"
step bundle "${A[@]}" export --bundle "$OUT/gpu.bundle" --run all --db "$DB"
step summary "${A[@]}" query --db "$DB" --report latest

if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "== failed steps: ${FAILED[*]} (their logs are in $OUT)"
    exit 1
fi
echo "== done: $OUT/gpu.duckdb, $OUT/gpu.bundle"
