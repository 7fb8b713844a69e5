#!/usr/bin/env bash
# Issue 36's checks on a GPU machine (PyTorch with CUDA, python3; no Rust
# toolchain, no network): the wheel built elsewhere is installed into a
# virtual environment that sees the machine's torch, then
#   1. what the machine has (GPU, torch, onnxruntime and its providers);
#   2. the wheel's self-test (simulated driver), from pip install to a pass;
#   3. identical_check.py: PyTorch's MemPool route and (where onnxruntime-gpu
#      and --onnx are there) ONNX Runtime's CUDA EP, outputs identical to
#      native; with TENSOR_ARENA_REQUIRE_TORCH_GPU=1, the MemPool part must run;
#   4. gpu_check.py: DenseNet-121, ResNet-50, BERT-base, native vs install()
#      vs pool() (each in its own process): outputs, footprint, time.
# Everything printed also goes to $OUT/issue36.log, figures to $OUT/*.json
# (OUT defaults to ./issue36-out).
#
# Usage: bash tools/gpu-check/issue36.sh WHEEL [--onnx MODEL] [--models M,..] [--repeat N]
# Exit status: 0 when every step passed, 1 otherwise, 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"
wheel="${1:-}"
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "usage: $0 WHEEL [--onnx MODEL] [--models M,..] [--repeat N]" >&2; exit 2; }
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
shift
onnx="" models="densenet121,resnet50,bert" repeat=10
while [ $# -gt 0 ]; do
  case "$1" in
    --onnx) onnx="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
out="${OUT:-$root/issue36-out}"
mkdir -p "$out"
log="$out/issue36.log"
exec > >(tee -a "$log") 2>&1
status=0
step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

step "the machine"
nvidia-smi -L || echo "nvidia-smi: no GPU listed"
python3 --version
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" \
  || echo "torch: not importable"
python3 -c "import onnxruntime, torch; print(onnxruntime.__version__, onnxruntime.get_available_providers(), torch.__version__)" \
  || echo "onnxruntime: not importable (the ONNX Runtime half is then tested with the simulated driver only)"

step "install the wheel into a venv that sees the machine's packages"
venv="$(mktemp -d)/venv"
# (A machine whose torch lives in a virtual environment of its own, as the
# H200 of the first sitting had it in /opt/torch/.venv, is not seen by a
# new venv: then the wheel goes into a directory on PYTHONPATH instead.)
if python3 -c "import torch" 2>/dev/null \
    && ! (python3 -m venv --system-site-packages "$venv" && "$venv/bin/python" -c "import torch") 2>/dev/null; then
  echo "the machine's torch is not visible from a new venv: installing into a directory on PYTHONPATH"
  site="$(mktemp -d)/site"
  python3 -m pip install --no-index --no-deps --quiet --target "$site" "$wheel" \
    || python3 -m zipfile -e "$wheel" "$site" || { echo "FAIL: cannot install $wheel"; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  py=python3
  echo "pip install: ok ($site)"
elif python3 -m venv --system-site-packages "$venv" \
    && "$venv/bin/python" -m pip install --no-index --no-deps --quiet "$wheel"; then
  py="$venv/bin/python"
  echo "pip install: ok ($venv)"
else
  # No venv module or no pip in it: install into a directory of its own
  # with the system's pip, or, without pip, unpack the wheel (a zip) there.
  echo "FAIL: pip install into a venv; installing into a directory instead"
  status=1
  site="$(mktemp -d)/site"
  python3 -m pip install --no-index --no-deps --quiet --target "$site" "$wheel" \
    || python3 -m zipfile -e "$wheel" "$site" || { echo "FAIL: cannot install $wheel"; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  py=python3
fi
run_dir="$(mktemp -d)"   # outside the source tree: the installed package is imported
cd "$run_dir"
"$py" -c "import tensor_arena_cuda as t; print('installed', t.__file__, t.library_path())"

step "the wheel's self-test (simulated driver)"
"$py" -m tensor_arena_cuda.selftest || status=1

step "outputs identical to native: MemPool route, ONNX Runtime CUDA EP"
args=()
[ -n "$onnx" ] && args+=(--onnx "$onnx")
TENSOR_ARENA_REQUIRE_TORCH_GPU=1 "$py" "$root/tools/gpu-check/identical_check.py" --parts mempool || status=1
"$py" "$root/tools/gpu-check/identical_check.py" --parts ort "${args[@]}" || status=1

step "footprint, outputs and time: native vs install() vs pool() ($models, --repeat $repeat)"
"$py" "$root/tools/gpu-check/gpu_check.py" --models "$models" --repeat "$repeat" \
  --routes install,mempool --json "$out/gpu_check.json" || status=1

step "done: status $status (log $log)"
exit $status
