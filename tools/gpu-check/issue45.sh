#!/usr/bin/env bash
# Issue 45's checks on a GPU machine (PyTorch with CUDA, torchvision,
# transformers, python3; no Rust toolchain, no network), within 8 minutes
# on an H100: the wheel built elsewhere is installed as issue36.sh does,
# then
#   1. what the machine has; the wheel's self-test (simulated driver);
#   2. record_traces.py: allocation traces (format v1) of DenseNet-121,
#      ResNet-50 and BERT-base through PyTorch's native allocator, one file
#      per model and shape and one -mixed per model in gpu_check.py's
#      orders, tarred into $OUT/gpu-traces.tar.gz (with their summary.json);
#   3. gpu_check.py --routes install --repeat 2 in the recorded orders
#      (gpu_check.py's own);
#   4. gpu_check.py --plans-twice in the recorded orders: two install()
#      processes per model, the second loading the plans the first saved;
#   5. gpu_check.py --routes install --repeat 2 in ascending orders
#      (GPU_CHECK_BATCHES="densenet121=1,4,8,16;resnet50=8,32,64;bert=64,128,512").
# Each step (and each model of steps 3-5, a process of its own) is bounded
# by `timeout`, and all of them by one deadline (--budget seconds, default
# 450), in that order of priority: a step with too little time left is
# skipped and says so. All figures go to $OUT/issue45.json, everything
# printed to $OUT/issue45.log (OUT defaults to ./issue45-out); a summary
# table ends the log.
#
# Usage: bash tools/gpu-check/issue45.sh WHEEL [--models M,..] [--budget SECONDS]
# Exit status: 0 when every step ran and passed, 1 otherwise (no GPU
# included), 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"
wheel="${1:-}"
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "usage: $0 WHEEL [--models M,..] [--budget SECONDS]" >&2; exit 2; }
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
shift
models="densenet121,resnet50,bert" budget=450
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
deadline=$((SECONDS + budget))
out="${OUT:-$root/issue45-out}"
mkdir -p "$out"
log="$out/issue45.log"
: > "$log"
exec > >(tee -a "$log") 2>&1
work="$(mktemp -d)"   # everything but the three files of $OUT
status=0
step() { printf '\n==> %s (%s, %ss left)\n' "$*" "$(date -u +%H:%M:%S)" "$((deadline - SECONDS))"; }
# Seconds a step may take: at most $1, and what is left before the deadline
# less $2 (kept for the steps after it) where that leaves 20 s or more, else
# all that is left (earlier steps come first); 0 under 20 s.
allow() {
  local left=$((deadline - SECONDS - ${2:-15}))
  [ "$left" -lt 20 ] && left=$((deadline - SECONDS - 5))
  [ "$left" -gt "$1" ] && left="$1"
  [ "$left" -lt 20 ] && left=0
  echo "$left"
}
# Runs "$@" under a time limit of $1 seconds; says so when it was cut.
bounded() {
  local limit="$1"; shift
  if [ "$limit" -le 0 ]; then echo "SKIPPED (no time left): $*"; return 124; fi
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "TIMED OUT after ${limit}s: $*"; fi
  return "$rc"
}

step "the machine"
timeout 20 nvidia-smi -L || echo "nvidia-smi: no GPU listed"
python3 --version
timeout 60 python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" \
  || echo "torch: not importable"

step "install the wheel into a venv that sees the machine's packages"
venv="$work/venv"
# (As issue36.sh: a torch in a virtual environment of its own is not seen by
# a new venv; then the wheel goes into a directory on PYTHONPATH.)
if timeout 60 python3 -c "import torch" 2>/dev/null \
    && ! (python3 -m venv --system-site-packages "$venv" && timeout 60 "$venv/bin/python" -c "import torch") 2>/dev/null; then
  echo "the machine's torch is not visible from a new venv: installing into a directory on PYTHONPATH"
  site="$work/site"
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
  echo "FAIL: pip install into a venv; installing into a directory instead"
  status=1
  site="$work/site"
  python3 -m pip install --no-index --no-deps --quiet --target "$site" "$wheel" \
    || python3 -m zipfile -e "$wheel" "$site" || { echo "FAIL: cannot install $wheel"; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  py=python3
fi
run_dir="$work/run"   # outside the source tree: the installed package is imported
mkdir -p "$run_dir"
cd "$run_dir"
"$py" -c "import tensor_arena_cuda as t; print('installed', t.__file__, t.library_path())" || status=1

step "the wheel's self-test (simulated driver)"
bounded 60 "$py" -m tensor_arena_cuda.selftest || status=1

# What torch sees: cuda (a GPU), fake (tools/gpu-check/fake, for a dry run
# of this script's flow: no traces, gpu_check.py on the simulated driver),
# or none (the GPU steps are not run, and the script fails).
gpu="$(timeout 60 "$py" -c "import torch; print('fake' if torch.__version__ == 'fake' else 'cuda' if torch.cuda.is_available() else 'none')" 2>/dev/null || echo none)"
echo "GPU for the steps below: $gpu"
[ "$gpu" = none ] && { echo "FAIL: no GPU visible to torch: the GPU steps below are not run"; status=1; }
[ "$gpu" = fake ] && echo "(a dry run: torch is the stand-in of tools/gpu-check/fake)"
IFS=, read -r -a model_list <<< "$models"
tool="$root/tools/gpu-check"
unset GPU_CHECK_BATCHES

step "1. allocation traces through PyTorch's native allocator ($models)"
traces="$work/traces"
if [ "$gpu" != none ]; then
  bounded "$(allow 200 200)" "$py" "$tool/record_traces.py" "$traces" --models "$models" --timeout 80 || status=1
  if ls "$traces"/*.trace >/dev/null 2>&1; then
    tar -czf "$out/gpu-traces.tar.gz" -C "$work" traces && echo "traces: $(ls "$traces"/*.trace | wc -l) files in $out/gpu-traces.tar.gz"
  elif [ "$gpu" = cuda ]; then
    echo "FAIL: no trace recorded"; status=1
  fi
else
  echo "not run: no GPU"
fi

# gpu_check.py per model (a process of its own, bounded): $1 the figures'
# name, $2 seconds per model, $3 seconds kept for the steps after, the
# rest gpu_check.py's arguments.
gpu_check() {
  local name="$1" cap="$2" keep="$3"; shift 3
  mkdir -p "$work/json/$name"
  for m in "${model_list[@]}"; do
    echo "-- $name: $m"
    bounded "$(allow "$cap" "$keep")" "$py" "$tool/gpu_check.py" --models "$m" --json "$work/json/$name/$m.json" "$@" \
      || { echo "gpu_check.py ($name, $m) failed or was cut"; status=1; }
  done
}

step "2. footprint in the recorded orders: native vs install(), --repeat 2"
if [ "$gpu" != none ]; then gpu_check recorded 70 160 --routes install --repeat 2; else echo "not run: no GPU"; fi

step "3. the plan store across two processes (recorded orders)"
if [ "$gpu" != none ]; then gpu_check plans_twice 60 100 --plans-twice; else echo "not run: no GPU"; fi

step "4. footprint in ascending orders: native vs install(), --repeat 2"
if [ "$gpu" != none ]; then
  GPU_CHECK_BATCHES="densenet121=1,4,8,16;resnet50=8,32,64;bert=64,128,512" \
    gpu_check ascending 70 5 --routes install --repeat 2
else
  echo "not run: no GPU"
fi

step "figures into $out/issue45.json; summary"
"$py" - "$work" "$out/issue45.json" "$gpu" "$models" <<'PY' || status=1
import glob, json, os, sys
work, dest, gpu, models = sys.argv[1:]
doc = {"gpu": gpu, "traces": None}
p = os.path.join(work, "traces", "summary.json")
if os.path.exists(p):
    doc["traces"] = json.load(open(p))
for name in ("recorded", "plans_twice", "ascending"):
    doc[name] = {}
    for f in sorted(glob.glob(os.path.join(work, "json", name, "*.json"))):
        doc[name].update(json.load(open(f)))
json.dump(doc, open(dest, "w"), indent=1)
MIB = 1 << 20
def r(a, b):
    return f"{a / b:.3f}" if a and b else "-"
def first(entry):
    a = (entry or {}).get("arena")
    n = (entry or {}).get("native")
    if not a or not n:
        return "-", "-", "-"
    seen = max(x["reserved_seen"] for x in a["rows"])
    return r(n["reserved_max"], n["live_max"]), r(a["reserved_max"], n["live_max"]), r(seen, n["live_max"])
print("\nsummary: max reserved / max live (native's live; the store's processes: their own);")
print("1st = first sight of each shape, rec / asc = recorded / ascending order, store p1 / p2 = --plans-twice")
head = ("model", "live MiB", "native", "1st rec", "seen rec", "1st asc", "store p1", "store p2", "same", "traces")
print("{:<12} {:>9} {:>7} {:>8} {:>9} {:>8} {:>9} {:>9} {:>5} {:>14}".format(*head))
for m in models.split(","):
    rec, asc, pt = doc["recorded"].get(m), doc["ascending"].get(m), doc["plans_twice"].get(m)
    nat, f_rec, s_rec = first(rec)
    f_asc = first(asc)[1]
    live = rec["native"]["live_max"] / MIB if rec and "native" in rec else None
    p1 = p2 = "-"
    if pt:
        a, b = pt["arena_process1"], pt["arena_process2"]
        p1, p2 = r(a["reserved_max"], a["live_max"]), r(b["reserved_max"], b["live_max"])
    same = all(e.get(k, True) for e, k in ((rec or {}, "identical_install"), (asc or {}, "identical_install"), (pt or {}, "identical")))
    t = (doc["traces"] or {}).get(m)
    tr = f"{len(t['runs'])} runs" if t else "-"
    print("{:<12} {:>9} {:>7} {:>8} {:>9} {:>8} {:>9} {:>9} {:>5} {:>14}".format(
        m, f"{live:.1f}" if live else "-", nat, f_rec, s_rec, f_asc, p1, p2, "yes" if same else "NO", tr))
PY
ls -la "$out"
step "done: status $status (log $log)"
exit $status
