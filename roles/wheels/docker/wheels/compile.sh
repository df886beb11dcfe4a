#!/bin/sh
# compile.sh COMMAND...: run one wheel build inside the image.
#
# BuildKit clips a step's output (2 MiB by default) and a flash-attn build prints far more, so
# the full output goes to a file and what reaches the build log is what a human needs: the job
# cap first, then the tail (always on failure, where the error is at the end).
set -u
log=/tmp/wheel-build.log
echo "wheel build: MAX_JOBS=${MAX_JOBS:-unset} NVCC_THREADS=${NVCC_THREADS:-unset}" \
     "CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-unset}" \
     "cores=$(nproc) memory=$(awk '/MemAvailable/ {printf "%.1f GiB available", $2/1048576}' /proc/meminfo)"
echo "wheel build: $*"
start=$(date +%s)
"$@" >"$log" 2>&1
rc=$?
lines=$(wc -l <"$log")
if [ "$rc" -ne 0 ]; then
    echo "---- last 150 of $lines lines:"
    tail -n 150 "$log"
    # The first errors are what a human needs and are far from the end of a long log; they
    # go last so that a short tail of the build output still shows them.
    echo "---- first error lines:"
    grep -n -m 15 -E 'error|Error|Killed|killed|out of memory' "$log" | cut -c1-400
    [ "$rc" -eq 137 ] && echo "exit 137: a compiler was killed (out of memory?); lower build_max_jobs"
    echo "---- wheel build FAILED (exit $rc) after $(( $(date +%s) - start ))s"
    exit "$rc"
fi
if [ "$lines" -le 400 ]; then
    cat "$log"
else
    head -n 100 "$log"; echo "---- ($lines lines, middle left out) ----"; tail -n 200 "$log"
fi
echo "wheel build: done in $(( $(date +%s) - start ))s"
command -v ccache >/dev/null && ccache --show-stats 2>/dev/null | head -n 12 || true
