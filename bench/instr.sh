#!/usr/bin/env bash
# instr.sh: instructions per operation of a Go benchmark, counted by
# valgrind's callgrind: exact and repeatable, unlike a timing, so a change of
# a few instructions on the message path shows (docs/performance.md,
# "Counting instructions").
#
#   bench/instr.sh [-n N] [-top K] PACKAGE BENCHMARK
#   bench/instr.sh ./mpiam 'SelfSendRecv$'
#
# It builds PACKAGE's test binary, runs BENCHMARK for exactly N iterations
# (default 100000) on one P under callgrind, and prints the benchmark body's
# instructions per iteration (inclusive) and the K functions (default 25) with
# the most instructions of their own per iteration. Asynchronous preemption
# and the garbage collector are off for the run: callgrind cannot follow Go's
# preemption signals, and a collection would be noise. Needs valgrind
# (apt-get install valgrind).
set -euo pipefail

n=100000
top=25
while [[ $# -gt 0 ]]; do
	case "$1" in
	-n) n=$2; shift 2 ;;
	-top) top=$2; shift 2 ;;
	-h|--help) sed -n '2,17p' "$0"; exit 0 ;;
	*) break ;;
	esac
done
if [[ $# -ne 2 ]]; then
	echo "usage: $0 [-n N] [-top K] PACKAGE BENCHMARK" >&2
	exit 2
fi
pkg=$1
bench=$2
command -v valgrind >/dev/null || { echo "instr.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
${GO:-go} test -c -o "$dir/test.bin" "$pkg"
GODEBUG=asyncpreemptoff=1 GOGC=off valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
	"$dir/test.bin" -test.run '^$' -test.bench "$bench" -test.benchtime "${n}x" -test.cpu 1 >"$dir/run.log" 2>&1 ||
	{ cat "$dir/run.log" >&2; exit 1; }
grep -E '^Benchmark' "$dir/run.log" || true

# callgrind_annotate lines: "  1,234,567 (12.34%)  file:function [binary]".
per_op() {
	awk -v n="$n" '{
		c = $1; gsub(",", "", c)
		name = $0; sub(/^ *[0-9,]+ +\([^)]*\) +/, "", name); sub(/ \[.*\]$/, "", name)
		sub(/^[^:]*:/, "", name); gsub(/github.com\/amgo-hpc\/amgo\//, "", name)
		printf "%8.0f  %s\n", c / n, name
	}'
}
echo "instructions per iteration, benchmark body (inclusive):"
callgrind_annotate --inclusive=yes "$dir/cg.out" 2>/dev/null |
	grep -E '^ *[0-9,]+ .*[Bb]ench[A-Za-z0-9_]*\.func1 ' | head -1 | per_op
echo "instructions per iteration, own (exclusive), top $top:"
callgrind_annotate "$dir/cg.out" 2>/dev/null | grep -E '^ *[0-9,]+ \(' | grep -v 'PROGRAM TOTALS' | head -"$top" | per_op
