#!/usr/bin/env bash
# bench/run.sh: `make bench`. Installs Open MPI and MPICH from Debian when they
# are missing (apt-get, as root), builds the C reference programs (bench/ref)
# with each MPI's mpicc, builds amrun and the osu command, runs bench/harness
# (amgo over loop, shm and tcp; Open MPI and MPICH over shared memory and TCP;
# interleaved, 3 repetitions) and draws the plots with bench/plot.
# Results: bench/results/<UTC stamp>/ (results.csv, results.md, *.svg, runs.log),
# bench/results/latest -> the newest. Arguments go to the harness
# (e.g. bench/run.sh -quick -reps 1, or -only 'latency/').
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
BIN=${BIN:-bin}
REF=bench/results/ref

pkgs=()
command -v mpicc.openmpi >/dev/null || pkgs+=(openmpi-bin libopenmpi-dev)
command -v mpicc.mpich >/dev/null || pkgs+=(mpich libmpich-dev)
if [ ${#pkgs[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "run.sh: installing ${pkgs[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
	else
		echo "run.sh: missing ${pkgs[*]} (run as root with apt-get to install them); their columns will be skipped" >&2
	fi
fi

mkdir -p "$REF"
# -Wno-stringop-overflow: MPICH's MPI_STATUSES_IGNORE trips a GCC 12 false positive.
CFLAGS="-O2 -Wall -Wno-stringop-overflow"
if command -v mpicc.openmpi >/dev/null; then
	mpicc.openmpi $CFLAGS -o "$REF/osu_ref_ompi" bench/ref/osu_ref.c
	mpicc.openmpi $CFLAGS -o "$REF/halo3d_ompi" bench/ref/halo3d.c
fi
if command -v mpicc.mpich >/dev/null; then
	mpicc.mpich $CFLAGS -o "$REF/osu_ref_mpich" bench/ref/osu_ref.c
	mpicc.mpich $CFLAGS -o "$REF/halo3d_mpich" bench/ref/halo3d.c
fi

$GO build -o "$BIN/" ./cmd/amrun ./bench/osu ./bench/harness ./examples/halo3d
dir=$("$BIN/harness" -bin "$BIN" -ref "$REF" -out bench/results "$@")
(cd bench/plot && $GO run . -o "../../$dir" "../../$dir/results.csv") ||
	echo "run.sh: plotting failed (bench/plot needs gonum.org/v1/plot from the module proxy)" >&2
echo "run.sh: results in $dir"
cat "$dir/results.md"
