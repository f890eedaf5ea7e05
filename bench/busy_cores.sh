#!/usr/bin/env bash
# Prints the machine's busy cores every 5 s (from /proc/stat), as "<seconds since start> <busy cores>",
# until killed: beside a timed command it tells whether the command kept the machine busy (CPU-bound:
# only less work makes it faster) or left cores idle (a packing problem).
#   bench/busy_cores.sh > busy.log & time make gates; kill %1
set -euo pipefail
cores=$(nproc)
start=$(date +%s)
read -r _ u n s i w x y z _ < /proc/stat
prev_busy=$((u + n + s + x + y + z)); prev_all=$((prev_busy + i + w))
while sleep 5; do
    read -r _ u n s i w x y z _ < /proc/stat
    busy=$((u + n + s + x + y + z)); all=$((busy + i + w))
    awk -v t=$(($(date +%s) - start)) -v c="$cores" -v b=$((busy - prev_busy)) -v a=$((all - prev_all)) \
        'BEGIN { printf "%d %.2f\n", t, (a > 0 ? c * b / a : 0) }'
    prev_busy=$busy; prev_all=$all
done
