#!/usr/bin/env bash
# bench/scale.sh: `make bench-scale`. Memory per rank and run time as a job
# grows on one node: the README's program (bench/scale) under amrun over
# shared memory, and the same program in C (bench/ref/scale.c) under Open
# MPI's mpirun and MPICH's mpiexec, interleaved, REPS repetitions (default
# 3); then in-process jobs (AMGO_TRANSPORT=loop). Figures: each rank's peak
# resident memory (VmHWM), averaged, and the launcher's wall time, median of
# the repetitions. Ranks beyond the cores are oversubscribed: the run times
# measure start-up and scheduling as much as communication.
#
#	bench/scale.sh [N ...]      default: 16 64 128
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BIN=${BIN:-bin}
REPS=${REPS:-3}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(16 64 128)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

$GO build -o "$BIN/" ./cmd/amrun ./bench/scale
ompi=() mpich=()
if command -v mpicc.openmpi >/dev/null && mpicc.openmpi -O2 -o "$out/scale_ompi" bench/ref/scale.c; then
	ompi=(mpirun.openmpi --oversubscribe --bind-to none)
	[ "$(id -u)" = 0 ] && ompi+=(--allow-run-as-root)
else
	echo "scale.sh: no Open MPI (openmpi-bin, libopenmpi-dev): its rows are skipped" >&2
fi
if command -v mpicc.mpich >/dev/null && mpicc.mpich -O2 -o "$out/scale_mpich" bench/ref/scale.c; then
	mpich=(mpiexec.mpich)
else
	echo "scale.sh: no MPICH (mpich, libmpich-dev): its rows are skipped" >&2
fi

# one NAME N CMD...: runs CMD, appends "NAME N avg-MB wall-s" to $out/rows.
one() {
	local name=$1 n=$2
	shift 2
	local t0 t1 line
	t0=$(date +%s.%N)
	if ! line=$("$@" 2>"$out/err" | grep '^scale:'); then
		echo "scale.sh: $name with $n ranks failed: $(tail -3 "$out/err")" >&2
		return 0
	fi
	t1=$(date +%s.%N)
	awk -v name="$name" -v n="$n" -v t0="$t0" -v t1="$t1" '{print name, n, $8, t1 - t0}' <<<"$line" >>"$out/rows"
}

for n in "${sizes[@]}"; do
	for rep in $(seq "$REPS"); do
		one amgo "$n" "$BIN/amrun" -n "$n" --timeout 600s "$BIN/scale"
		[ ${#ompi[@]} -gt 0 ] && one openmpi "$n" "${ompi[@]}" -n "$n" "$out/scale_ompi"
		[ ${#mpich[@]} -gt 0 ] && one mpich "$n" "${mpich[@]}" -n "$n" "$out/scale_mpich"
	done
done
for n in 64 256; do
	for rep in $(seq "$REPS"); do
		one "amgo-in-process" "$n" env AMGO_TRANSPORT=loop AMGO_LOOP_SIZE="$n" "$BIN/scale"
	done
done

echo "# memory per rank (peak RSS, MB) and launcher wall time (s), median of $REPS; $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "| job | ranks | MB per rank | total MB | wall s |"
echo "| --- | --- | --- | --- | --- |"
sort -k1,1 -k2,2n "$out/rows" | awk '
function isort(a, c,    i, j, v) {
	for (i = 2; i <= c; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
}
function flush() {
	if (key == "") return
	isort(mb, c); isort(wt, c)
	m = mb[int((c + 1) / 2)]; w = wt[int((c + 1) / 2)]
	printf "| %s | %d | %.1f | %.0f | %.2f |\n", name, n, m, m * n, w
	delete mb; delete wt; c = 0
}
{ k = $1 " " $2; if (k != key) { flush(); key = k; name = $1; n = $2 } c++; mb[c] = $3 + 0; wt[c] = $4 + 0 }
END { flush() }'
