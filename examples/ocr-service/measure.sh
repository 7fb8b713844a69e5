#!/usr/bin/env bash
# One measured configuration of the OCR service, in its own process: starts
# app.py with uvicorn (PYTHON, default python3, the service's environment),
# runs load.py against it, stops it, and prints load.py's JSON line plus,
# with MEMORY_MAX, the control group's figures. Whatever happens the server
# is stopped and the group removed.
#
#   examples/ocr-service/measure.sh CLIENTS REQUESTS [IDLE_S]
#
# Environment: the server's own (MALLOC_ARENA_MAX, LD_PRELOAD,
# TENSOR_ARENA_MEMORY_LIMIT, OCR_WORKERS) is passed on; UVICORN_WORKERS=N
# starts N worker processes (uvicorn's --workers). MEMORY_MAX=1G runs
# the server in a new memory control group with that limit (needs root and
# a writable /sys/fs/cgroup: v2's memory.max, else v1's
# memory.limit_in_bytes), as `docker run --memory 1g` would. The figures in
# docs/python-deploy.md come from this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
clients="${1:?clients}" requests="${2:?requests}" idle="${3:-10}"
py="${PYTHON:-python3}"
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
group=""
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    if [ -n "$group" ]; then rmdir "$group" 2>/dev/null || true; fi
    rm -f "$log"
}
trap cleanup EXIT

start=(exec "$py" -m uvicorn app:app --host 127.0.0.1 --port "$port" --log-level warning --workers "${UVICORN_WORKERS:-1}")
if [ -n "${MEMORY_MAX:-}" ]; then
    bytes="$("$py" -c "import sys; v = sys.argv[1].upper(); m = {'K': 10, 'M': 20, 'G': 30}; print(int(v[:-1]) << m[v[-1]] if v[-1] in m else int(v))" "$MEMORY_MAX")"
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        group="/sys/fs/cgroup/ocr-measure-$$"
        mkdir "$group"; echo "$bytes" >"$group/memory.max"; echo 0 >"$group/memory.swap.max" 2>/dev/null || true
    else
        group="/sys/fs/cgroup/memory/ocr-measure-$$"
        mkdir "$group"; echo "$bytes" >"$group/memory.limit_in_bytes"
    fi
    (cd "$here" && exec sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$group" "${start[@]:1}" >"$log" 2>&1) &
else
    (cd "$here" && "${start[@]}" >"$log" 2>&1) &
fi
pid=$!
for _ in $(seq 1 360); do
    "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=5)" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "measure: the server exited:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.5
done
rc=0
"$py" "$here/load.py" --url "http://127.0.0.1:$port" --clients "$clients" --requests "$requests" --idle "$idle" || rc=$?
kill -0 "$pid" 2>/dev/null || { echo "measure: the server died during the load:" >&2; tail -20 "$log" >&2; rc=1; }
if [ -n "$group" ]; then
    if [ -f "$group/memory.peak" ]; then
        echo "{\"cgroup_peak_mib\": $(( $(cat "$group/memory.peak") >> 20 )), \"cgroup_events\": \"$(tr '\n' ' ' <"$group/memory.events")\"}"
    else
        echo "{\"cgroup_peak_mib\": $(( $(cat "$group/memory.max_usage_in_bytes") >> 20 )), \"cgroup_failcnt\": $(cat "$group/memory.failcnt"), \"cgroup_oom\": \"$(tr '\n' ' ' <"$group/memory.oom_control")\"}"
    fi
fi
exit "$rc"
