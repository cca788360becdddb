#!/bin/bash
# The README's GPU command as a new user runs it (issue 27): `robotloop loop --preset h200` from a fresh folder, with
# the default relative --report-dir, on an empty cache; then counts what the user should never see in its output
# (logging-format lines, tracebacks, library warnings, Python values). Results in $1 (default /tmp/newuser):
# loop.log, report.json, report.md, noise.txt.
#
#   source .gpu/env.sh && bash benchmarks/h200_newuser.sh "$OUT"
set -u
R=${1:-/tmp/newuser}
mkdir -p "$R"
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export XDG_CACHE_HOME=$work/cache
cd "$work"
start=$(date +%s)
python3 -m robotloop.cli loop --preset h200 > "$R/loop.log" 2>&1
rc=$?
echo "exit $rc after $(( $(date +%s) - start )) s (main at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))" \
  > "$R/noise.txt"
cp loop-report/report.json loop-report/report.md "$R/" 2>/dev/null
count() { printf '%-48s %s\n' "$1" "$(grep -cE "$2" "$R/loop.log")" >> "$R/noise.txt"; }
count "logging-format lines (LEVEL:name: / timestamps)" '^(WARNING|INFO|ERROR|DEBUG):|^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8}'
count "traceback lines" 'Traceback|^\s+File "'
count "torchcodec loading notes" 'libtorchcodec|Falling back to'
count "SyntaxWarning lines" 'SyntaxWarning'
count "'Loading weights' prints" 'Loading weights from local directory'
count "Python tuples like (48, 64)" '\([0-9]+, [0-9]+\)'
count "warning: lines (the CLI's own notes)" '^warning: '
exit $rc
