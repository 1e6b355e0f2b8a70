#!/usr/bin/env bash
# The CPU seconds of a command's whole process tree, daemons included (Ray's raylet and
# workers, a testbed's control plane, podman's conmon): each of them stays in a cgroup v1
# cpuacct group made for the run, where `time` counts only the children it waited for.
# Usage (root, cgroup v1): bench/cpu_of.sh NAME COMMAND [ARGS...]; the command's output goes
# to /tmp/cpu-of-NAME.out, one line to stdout: wall and CPU seconds. Used for the suite's
# CPU figures in docs/benchmarks.md ("Where the suite's CPU goes").
set -uo pipefail
name=$1; shift
cg=/sys/fs/cgroup/cpuacct/cpu-of-$name
[ -d /sys/fs/cgroup/cpuacct ] || { echo "needs cgroup v1's cpuacct (/sys/fs/cgroup/cpuacct)" >&2; exit 2; }
mkdir -p "$cg" && echo 0 >"$cg/cpuacct.usage"
start=$(date +%s.%N)
( echo "$BASHPID" >"$cg/tasks"; exec "$@" ) >"/tmp/cpu-of-$name.out" 2>&1
rc=$?
end=$(date +%s.%N)
sleep 2  # daemons the command left behind finish their exit
used=$(cat "$cg/cpuacct.usage")
printf '%s: exit %d, wall %.1f s, CPU %.1f s (whole process tree)\n' "$name" "$rc" \
  "$(echo "$end - $start" | bc)" "$(echo "$used / 1000000000" | bc -l)"
for pid in $(cat "$cg/tasks"); do kill -9 "$pid" 2>/dev/null; done
sleep 1; rmdir "$cg" 2>/dev/null || true
exit "$rc"
