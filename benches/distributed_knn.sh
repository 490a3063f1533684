#!/usr/bin/env bash
# `wml knn` in one process against `mpirun -np N wml knn --distributed` on this machine: wall
# time, peak RSS of every rank (GNU time), the bytes a rank moves per query block, and a check
# that every run wrote the same files. The ranks share this machine's cores, so the times say
# little about a cluster; the per-rank memory is the point: each rank reads and holds only
# its share of the references.
#
#   cargo build --release --features mpi --bin wml
#   benches/distributed_knn.sh [QUERIES] [REFS] [DIM] [K]   (default 10000 200000 128 10)
set -euo pipefail
cd "$(dirname "$0")/.."
wml="$(realpath target/release/wml)"
q="${1:-10000}" n="${2:-200000}" d="${3:-128}" k="${4:-10}"
python="${PYTHON:-python3}"
mpirun=(mpirun --oversubscribe --tag-output)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

"$python" - "$dir" "$q" "$n" "$d" <<'EOF'
import sys
import numpy as np
out, q, n, d = sys.argv[1], *map(int, sys.argv[2:])
rng = np.random.default_rng(0)
np.save(f"{out}/queries.npy", rng.standard_normal((q, d), dtype=np.float32))
np.save(f"{out}/refs.npy", rng.standard_normal((n, d), dtype=np.float32))
EOF
echo "queries ($q, $d), references ($n, $d) = $((n * d * 4 / 1048576)) MiB, k = $k, cosine, native path"

args=(knn --queries "$dir/queries.npy" --refs "$dir/refs.npy" -k "$k" --distance cosine --backend cpu)
start=$(date +%s.%N)
/usr/bin/time -f "  process: peak RSS %M KiB" "$wml" "${args[@]}" \
    --out-indices "$dir/one-i.npy" --out-scores "$dir/one-s.npy"
echo "1 process: $(echo "$(date +%s.%N) - $start" | bc) s"
for ranks in 2 3; do
    start=$(date +%s.%N)
    "${mpirun[@]}" -np "$ranks" /usr/bin/time -f "  a rank: peak RSS %M KiB" "$wml" "${args[@]}" \
        --distributed --out-indices "$dir/$ranks-i.npy" --out-scores "$dir/$ranks-s.npy"
    echo "$ranks ranks: $(echo "$(date +%s.%N) - $start" | bc) s"
    cmp "$dir/one-i.npy" "$dir/$ranks-i.npy" && cmp "$dir/one-s.npy" "$dir/$ranks-s.npy"
    # Per block of B = 2048 queries: the owner sends B·d·4 bytes to each other rank and
    # receives B·k·(4 + 4) from each (indices and scores).
    block=2048
    echo "  per query block of $block: $((block * d * 4)) bytes out to each of $((ranks - 1)) other ranks, $((block * k * 8)) bytes back from each"
done
echo "every run wrote the same files"
