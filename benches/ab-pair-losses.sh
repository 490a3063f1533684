#!/bin/bash
# Same-run A/B of the native pair losses between two builds of `bench_mining`: the two
# binaries alternate, ROUNDS rounds (default 3) per case, each the median of 9 calls.
#
#   git worktree add /tmp/old <commit> && CARGO_TARGET_DIR=/tmp/oldtarget \
#       cargo build --release --example bench_mining --manifest-path /tmp/old/Cargo.toml
#   cargo build --release --example bench_mining
#   benches/ab-pair-losses.sh /tmp/oldtarget/release/examples/bench_mining \
#       target/release/examples/bench_mining
#
# Prints one line per call: `loss B M old|new seconds`. Not part of CI.
set -euo pipefail
old=${1:?old bench_mining}
new=${2:?new bench_mining}
rounds=${ROUNDS:-3}
cases=(
    "contrastive 256 4096" "multi_similarity 256 4096" "supcon 256 4096" "circle 256 4096"
    "nca 256 4096" "generalized_lifted 256 4096" "intra_pair_variance 256 4096"
    "margin 256 4096" "instance 1024 0" "supcon 1024 0" "contrastive 1024 0"
    "fast_ap 1024 0" "ranked_list 1024 0"
)
for c in "${cases[@]}"; do
    read -r name b m <<<"$c"
    for _ in $(seq "$rounds"); do
        for which in old new; do
            bin=$old
            [ "$which" = new ] && bin=$new
            secs=$("$bin" --path cpu --func "loss_pair_$name" --B "$b" --M "$m" --C 10 --D 128 \
                --reps 9 2>&1 | tail -1 | grep -o '"median_s": [0-9.]*' | cut -d' ' -f2)
            echo "$name $b $m $which $secs"
        done
    done
done
