#!/usr/bin/env bash
# pgo.sh: makes bench/osu/default.pgo, the CPU profile with which Go's
# profile-guided optimization (go build -pgo, Go 1.21 and later) builds osu,
# from runs of osu's small-message tests over shared memory and the network
# (docs/performance.md, "Profile-guided optimization"). A program of one's own
# can be built with the same profile: copy it into the main package's
# directory as default.pgo, or merge it with a profile of the program
# (go tool pprof -proto a.pgo b.pgo > default.pgo).
#
#   bench/pgo.sh            (make pgo)
set -euo pipefail
GO=${GO:-go}
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
$GO build -pgo=off -o "$dir/osu" ./bench/osu
$GO build -o "$dir/amrun" ./cmd/amrun
run() { OSU_CPUPROFILE="$dir/prof" "$dir/amrun" "$@" >/dev/null; }
for t in latency bw bibw; do
	run -n 2 "$dir/osu" $t -m 1:16384
	run -n 2 --transport tcp "$dir/osu" $t -m 1:65536 -i 2000
done
run -n 2 "$dir/osu" mbw_mr -m 1:4096
run -n 2 "$dir/osu" latency -d vector -m 1:1048576 -i 2000
for t in barrier "bcast -m 1:1024" "allreduce -m 1:1024" "ibarrier" "iallreduce -m 1:1024"; do
	run -n 2 "$dir/osu" $t
done
$GO tool pprof -proto "$dir"/prof.* >bench/osu/default.pgo
echo "bench/osu/default.pgo: $(wc -c <bench/osu/default.pgo) bytes from $(ls "$dir"/prof.* | wc -l) profiles"
