#!/usr/bin/env bash
# Fragments this machine's free memory, runs a command, and says whether a
# fault compacted memory directly (the "no stall" check of the huge-page
# policy, docs/decisions.md, "Huge pages without the stall").
#
# Usage: benches/fragment.sh [-a ANON_GIB] [-c CACHE] [--] COMMAND [ARGS...]
#
#   -a ANON_GIB  anonymous memory to take, write, and free every other 4 KiB
#                page of (default 2): each 2 MiB block of it keeps a page in
#                use, so none of its free memory forms a huge page. Held
#                while COMMAND runs, then freed.
#   -c CACHE     fill the page cache first: a directory (its files are read,
#                nothing is written) or a size in GiB (a file of that size
#                is written under ${TMPDIR:-/tmp}, read back, and deleted at
#                the end; refused on tmpfs, where it would not be cache).
#
# Memory is fragmented only as far as these reach: on a machine with more
# free memory than ANON_GIB and the cache together, free huge pages remain
# elsewhere (the script prints how many, before and during COMMAND). It
# changes no system setting (no drop_caches, no compact_memory, no THP
# knob) and refuses to take more than half of MemAvailable. Needs python3.
#
# Example (the replay's first large runs, on fragmented memory):
#   benches/fragment.sh -a 3 -c target -- \
#       target/release/tensor-arena replay --trace traces/ort/ppocr-det-sizes.trace
#
# Not run by CI or the tests.
set -euo pipefail

anon_gib=2
cache=""
while getopts "a:c:h" opt; do
    case $opt in
        a) anon_gib=$OPTARG ;;
        c) cache=$OPTARG ;;
        h) sed -n '2,27p' "$0"; exit 0 ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[[ ${1:-} == "--" ]] && shift
if [[ $# -eq 0 ]]; then
    echo "fragment.sh: no command given (see -h)" >&2
    exit 2
fi
if [[ ! $anon_gib =~ ^[0-9]+$ ]]; then
    echo "fragment.sh: -a takes whole GiB, not '$anon_gib'" >&2
    exit 2
fi
if [[ $(uname -s) != Linux ]]; then
    echo "fragment.sh: Linux only" >&2
    exit 2
fi

meminfo() { awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo; }
vmstat() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }
# Free blocks of 2 MiB or more (order 9 and up, in 2 MiB), outside DMA.
free_huge() {
    awk '$4 != "DMA" { for (i = 14; i <= NF; i++) n += $i * 2 ^ (i - 14) } END { print n + 0 }' /proc/buddyinfo
}

avail_kib=$(meminfo MemAvailable)
anon_kib=$((anon_gib * 1024 * 1024))
cache_kib=0
[[ $cache =~ ^[0-9]+$ ]] && cache_kib=$((cache * 1024 * 1024))
if ((2 * (anon_kib + cache_kib) > avail_kib)); then
    echo "fragment.sh: -a $anon_gib GiB and a cache file of $((cache_kib >> 20)) GiB are over half of MemAvailable ($((avail_kib >> 20)) GiB); refused" >&2
    exit 2
fi

holder=""
cache_file=""
cleanup() {
    if [[ -n $holder ]]; then
        kill "$holder" 2>/dev/null || true
        wait "$holder" 2>/dev/null || true
    fi
    [[ -n $cache_file ]] && rm -f "$cache_file"
    return 0
}
trap cleanup EXIT INT TERM

echo "fragment.sh: free 2 MiB blocks before: $(free_huge)" >&2

if [[ -n $cache ]]; then
    if [[ -d $cache ]]; then
        echo "fragment.sh: reading $cache into the page cache" >&2
        find "$cache" -type f -print0 | xargs -0 -r cat >/dev/null 2>&1 || true
    elif [[ $cache =~ ^[0-9]+$ ]]; then
        dir=${TMPDIR:-/tmp}
        if [[ $(stat -f -c %T "$dir") == tmpfs ]]; then
            echo "fragment.sh: $dir is tmpfs: a cache file there is not page cache; set TMPDIR" >&2
            exit 2
        fi
        cache_file=$(mktemp "$dir/fragment.XXXXXX")
        echo "fragment.sh: writing and reading $cache GiB in $cache_file" >&2
        dd if=/dev/zero of="$cache_file" bs=1M count=$((cache * 1024)) status=none
        cat "$cache_file" >/dev/null
    else
        echo "fragment.sh: -c takes a directory or whole GiB, not '$cache'" >&2
        exit 2
    fi
fi

if ((anon_gib > 0)); then
    # The holder writes every page, then frees every other one, says
    # "ready", and holds the rest until it is killed (by `cleanup`).
    exec 3< <(python3 - "$anon_gib" <<'PY'
import mmap, signal, sys
size = int(sys.argv[1]) << 30
page = mmap.PAGESIZE
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)  # base pages, so each can go alone
for off in range(0, size, page):
    m[off] = 1
for off in range(page, size, 2 * page):
    m.madvise(mmap.MADV_DONTNEED, off, page)
print("ready", flush=True)
while True:
    signal.pause()
PY
)
    holder=$!
    read -r line <&3 || true
    if [[ $line != ready ]]; then
        echo "fragment.sh: the anonymous holder did not start" >&2
        exit 1
    fi
    echo "fragment.sh: holding $anon_gib GiB, every other page freed" >&2
fi

stall0=$(vmstat compact_stall)
fallback0=$(vmstat thp_fault_fallback)
echo "fragment.sh: free 2 MiB blocks now: $(free_huge)" >&2
set +e
"$@"
rc=$?
set -e
echo "fragment.sh: during the command: direct compactions (compact_stall) +$(($(vmstat compact_stall) - stall0)), huge-page faults that fell back to base pages +$(($(vmstat thp_fault_fallback) - fallback0)) (system-wide); free 2 MiB blocks after: $(free_huge)" >&2
exit $rc
