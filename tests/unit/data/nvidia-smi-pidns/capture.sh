#!/bin/bash
# Captures what NVML (through nvidia-smi) lists from the machine's own PID namespace, from a
# child PID namespace and from a user+PID namespace, with a GPU memory holder outside and
# (in the namespace cases) one inside. Run as root on a GPU machine with torch and nvidia-smi:
#   OUT=/some/dir bash tests/unit/data/nvidia-smi-pidns/capture.sh
# Writes one file per case into a tarball, $OUT/captures.tgz (cap/*.txt).
set -u
OUT=${OUT:-/tmp/nvidia-smi-pidns}
WORK=$(mktemp -d)
CAP=$WORK/cap
mkdir -p "$CAP" "$OUT"
PY=$(command -v python3 || command -v python)
export PY
HOLD='import torch, time; x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); time.sleep(600)'
export HOLD
SYNC=$(mktemp -d)
export SYNC

queries() {
  for q in 'nvidia-smi --query-compute-apps=pid,used_memory,name --format=csv' \
           'nvidia-smi --query-gpu=memory.used,driver_version --format=csv' \
           'nvidia-smi -q -d PIDS'; do
    echo "## \$ $q"
    $q 2>&1
    echo "## rc=$?"
  done
}
export -f queries

header() {  # $1 = case description
  echo "# case: $1"
  echo "# captured: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "# pid namespace: $(readlink /proc/self/ns/pid) user namespace: $(readlink /proc/self/ns/user)"
  echo "# uid_map: $(tr -s ' ' < /proc/self/uid_map | tr '\n' ';')"
  echo "# this shell's pid: $$ ; NSpid: $(grep NSpid /proc/self/status | cut -f2-)"
}
export -f header

wait_listed() {  # poll until nvidia-smi lists $1 processes or more (max 90 s)
  for _ in $(seq 90); do
    n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c .)
    [ "$n" -ge "$1" ] && return 0
    sleep 1
  done
  return 1
}
export -f wait_listed

{
  echo "# environment of the capture"
  date -u +%Y-%m-%dT%H:%M:%SZ
  uname -a
  cat /proc/driver/nvidia/version
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "## /proc/1/cmdline: $(tr '\0' ' ' < /proc/1/cmdline)"
  echo "## pid ns: $(readlink /proc/self/ns/pid)"
  echo "## /proc/driver/nvidia/params (profiling, modeset):"
  grep -iE 'Profil|Admin' /proc/driver/nvidia/params
  echo "## dcgm: $(command -v dcgmi nv-hostengine dcgm-exporter || echo 'no dcgmi, nv-hostengine or dcgm-exporter on PATH')"
  ls /usr/lib/x86_64-linux-gnu 2>/dev/null | grep -i dcgm || echo 'no libdcgm in /usr/lib/x86_64-linux-gnu'
  echo "## GPM (nvidia-smi dmon --gpm-metrics 1 -c 1):"
  timeout 20 nvidia-smi dmon --gpm-metrics 1 -c 1 2>&1 | head -5
  echo "## devices: $(ls -l /dev/nvidia* 2>&1 | tr "\n" ";")"
  grep -E "^Cap(Eff|Bnd)" /proc/self/status
  echo "## unshare: $(command -v unshare) $(unshare --version 2>&1)"
  echo "## python: $PY $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1)"
} > "$CAP/00-environment.txt" 2>&1

{ header "machine namespace, no holder"; queries; } > "$CAP/01-root-none.txt"

$PY -c "$HOLD" &
OUTSIDE=$!
wait_listed 1 || echo "outside holder never listed" >&2
{ header "machine namespace, one holder in this namespace (pid $OUTSIDE, 2 GiB)"; queries; } > "$CAP/02-root-outside-holder.txt"

# A child PID namespace: first only the outside holder, then one of its own as well.
inside_case() {  # $1 = label; runs inside the new namespace
  { header "$1, before its own holder; outside: $OUTSIDE_TEXT"; queries
    echo "## \$ nvidia-smi dmon --gpm-metrics 1 -c 1 (GPM counters from this namespace)"
    timeout 20 nvidia-smi dmon --gpm-metrics 1 -c 1 2>&1 | head -5; } > "$CAP/$2-before.txt"
  $PY -c "$HOLD" &
  IN=$!
  for _ in $(seq 90); do
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qx "$IN" && break
    sleep 1
  done
  { header "$1, one holder inside (pid $IN here); outside: $OUTSIDE_TEXT"; queries; } > "$CAP/$2-inside.txt"
  touch "$SYNC/$2.ready"
  for _ in $(seq 60); do [ -e "$SYNC/$2.done" ] && break; sleep 1; done
  kill "$IN"; wait "$IN" 2>/dev/null
}
export -f inside_case
OUTSIDE_TEXT="one holder (machine pid $OUTSIDE, 2 GiB)"
export OUTSIDE CAP OUTSIDE_TEXT

run_ns() {  # $1 = file prefix, $2 = label, rest = unshare options
  p=$1; l=$2; shift 2
  ( unshare "$@" bash -c "inside_case '$l' $p" ) 2> "$CAP/$p-unshare.err" &
  U=$!
  for _ in $(seq 120); do [ -e "$SYNC/$p.ready" ] && break; kill -0 $U 2>/dev/null || break; sleep 1; done
  if [ -e "$SYNC/$p.ready" ]; then
    { header "machine namespace while '$l' holds one inside; outside: $OUTSIDE_TEXT"
      echo "# machine-namespace pids of the inside holders: $(pgrep -f 'torch.empty' | tr '\n' ' ')"
      for pid in $(pgrep -f 'torch.empty'); do echo "#   $pid NSpid: $(grep NSpid /proc/$pid/status | cut -f2-)"; done
      queries; } > "$CAP/$p-machine-view.txt"
  fi
  touch "$SYNC/$p.done"
  wait $U
  echo "# unshare $* rc=$?" >> "$CAP/$p-unshare.err"
}

run_ns 03-pidns "PID namespace (unshare --pid --fork --mount-proc)" --pid --fork --mount-proc
run_ns 04-userns "user+PID namespace (unshare --user --map-root-user --pid --fork --mount-proc)" \
  --user --map-root-user --pid --fork --mount-proc
if [ ! -e "$SYNC/04-userns.ready" ]; then  # some containers refuse a fresh proc mount in a user namespace
  run_ns 05-userns-noproc "user+PID namespace without a new /proc (unshare --user --map-root-user --pid --fork)" \
    --user --map-root-user --pid --fork
fi

kill $OUTSIDE; wait $OUTSIDE 2>/dev/null
sleep 2
OUTSIDE_TEXT="no holder"
export OUTSIDE_TEXT
run_ns 07-pidns-alone "PID namespace (unshare --pid --fork --mount-proc)" --pid --fork --mount-proc
{ header "machine namespace after all holders exited"; queries; } > "$CAP/06-root-after.txt"
tar -C "$WORK" -czf "$OUT/captures.tgz" cap
ls -l "$CAP"
