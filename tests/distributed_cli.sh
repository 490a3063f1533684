#!/usr/bin/env bash
# `wml knn|accuracy --distributed` under mpirun against the same command in one process: the
# output files byte for byte, the printed JSON character for character, with 2 and 3 ranks
# (uneven shares); a bad input on one rank's share ends every rank with an error and writes
# nothing. Usage: tests/distributed_cli.sh target/debug/wml (built with --features mpi).
set -euo pipefail
wml="$(realpath "${1:?the wml binary, built with --features mpi}")"
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cd "$dir"

# A .npy writer from the standard library alone, for both data sets below.
cat > npy_save.py <<'EOF'
import array, struct

def save(path, typecode, descr, shape, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(array.array(typecode, values).tobytes())
EOF

# float32 and float64 rows, int64 and int32 labels, with duplicated rows for ties across
# ranks.
python3 - <<'EOF'
import random
from npy_save import save

rng = random.Random(7)
d = 24
def rows(n):
    out = []
    for i in range(n):
        if i and rng.random() < 0.2:
            j = rng.randrange(i)
            out.extend(out[j * d:(j + 1) * d])
        else:
            out.extend(rng.uniform(-1, 1) for _ in range(d))
    return out
save("queries.npy", "f", "<f4", (301, d), rows(301))
save("refs.npy", "d", "<f8", (1000, d), rows(1000))
save("labels.npy", "q", "<i8", (301,), [rng.randrange(9) for _ in range(301)])
save("ref_labels.npy", "i", "<i4", (1000,), [rng.randrange(9) for _ in range(1000)])
save("short_labels.npy", "q", "<i8", (300,), [0] * 300)
save("two.npy", "f", "<f4", (2, d), rows(2))
nan_refs = rows(100)
nan_refs[-1] = float("nan")  # in the last rank's share only
save("nan_refs.npy", "f", "<f4", (100, d), nan_refs)
EOF

same() {
    cmp "$1" "$2" || { echo "FAIL: $1 and $2 differ"; exit 1; }
}

run_knn() { # name backend args... (DIST: more options for the distributed runs only)
    local name="$1" backend="$2"
    shift 2
    "$wml" knn "$@" --backend "$backend" --out-indices "one-$name-i.npy" --out-scores "one-$name-s.npy"
    for np in 2 3; do
        # shellcheck disable=SC2086 # DIST is a list of options
        "${mpirun[@]}" -np "$np" "$wml" knn "$@" --backend "$backend" --distributed ${DIST:-} \
            --out-indices "$np-$name-i.npy" --out-scores "$np-$name-s.npy"
        same "one-$name-i.npy" "$np-$name-i.npy"
        same "one-$name-s.npy" "$np-$name-s.npy"
    done
    echo "knn $name ($backend): 2 and 3 ranks write the single process's files"
}
run_knn refs cpu --queries queries.npy --refs refs.npy -k 17 --distance cosine
DIST="--query-block 7" run_knn blocks cpu --queries queries.npy --refs refs.npy -k 6
run_knn self cpu --queries refs.npy -k 5 --no-normalize
# k above one rank's share of the references (333 or 334 of 1000 with 3 ranks).
run_knn big-k cpu --queries queries.npy --refs refs.npy -k 500 --distance dot
# Two queries over 3 ranks: rank 0's share is empty.
run_knn empty-share cpu --queries two.npy --refs refs.npy -k 4
run_knn gpu wgpu --queries queries.npy --refs refs.npy -k 9

run_accuracy() { # name args...
    local name="$1"
    shift
    "$wml" accuracy "$@" --backend cpu > "one-$name.json"
    for np in 2 3; do
        "${mpirun[@]}" -np "$np" "$wml" accuracy "$@" --backend cpu --distributed > "$np-$name.json"
        same "one-$name.json" "$np-$name.json"
    done
    echo "accuracy $name: $(cat "one-$name.json")"
}
run_accuracy self --embeddings refs.npy --labels ref_labels.npy
run_accuracy refs --embeddings queries.npy --labels labels.npy --refs refs.npy \
    --ref-labels ref_labels.npy --k max_bin_count --avg-of-avgs

# A label file one row short: every rank fails (rank 0 reads the bad count too), nothing
# is written, mpirun exits non-zero.
if "${mpirun[@]}" -np 3 "$wml" accuracy --embeddings queries.npy --labels short_labels.npy \
    --backend cpu --distributed > bad.json 2> bad.err; then
    echo "FAIL: a short label file passed"; exit 1
fi
grep -q "300 labels for 301 rows" bad.err || { cat bad.err; echo "FAIL: no message"; exit 1; }
[ ! -s bad.json ] || { echo "FAIL: output after an error"; exit 1; }
# k above every reference: the library's error on every rank, no output file.
if "${mpirun[@]}" -np 2 "$wml" knn --queries queries.npy --refs refs.npy -k 1001 --backend cpu \
    --distributed --out-indices bad-i.npy --out-scores bad-s.npy 2> bad.err; then
    echo "FAIL: k past the references passed"; exit 1
fi
[ "$(grep -c "k = 1001" bad.err)" = 2 ] || { cat bad.err; echo "FAIL: not every rank failed"; exit 1; }
[ ! -e bad-i.npy ] || { echo "FAIL: output after an error"; exit 1; }
# A NaN in the last rank's share (its row 33 of 34): that rank reports it, the others name it.
if "${mpirun[@]}" -np 3 "$wml" knn --queries queries.npy --refs nan_refs.npy -k 3 --backend cpu \
    --distributed --out-indices bad-i.npy --out-scores bad-s.npy 2> bad.err; then
    echo "FAIL: a NaN passed"; exit 1
fi
grep -q "rank 2: knn .*local_refs holds a non-finite value NaN at row 33, column 23" bad.err \
    && [ "$(grep -c "rank 2 failed: distributed knn: local_refs holds a non-finite" bad.err)" = 2 ] \
    || { cat bad.err; echo "FAIL: one rank's NaN was not reported by every rank"; exit 1; }
[ ! -e bad-i.npy ] || { echo "FAIL: output after an error"; exit 1; }
echo "failures end every rank with the error and write nothing"
# A timeout no step can meet: a rank that gives up says so and aborts the whole job (a
# collective it left posted would hang MPI_Finalize); nothing is written.
if "${mpirun[@]}" -np 2 "$wml" knn --queries queries.npy --refs refs.npy -k 3 --backend cpu \
    --distributed --timeout 0.000001 --out-indices late-i.npy --out-scores late-s.npy \
    2> late.err; then
    echo "FAIL: a timeout passed"; exit 1
fi
grep -q "gave up on the other ranks after .* aborting the job" late.err \
    || { cat late.err; echo "FAIL: no timeout reported"; exit 1; }
[ ! -e late-i.npy ] || { echo "FAIL: output after a timeout"; exit 1; }
echo "a timeout ends the job, which writes nothing"

# PML's losses with class weights: each rank reads its rows and its classes of the weights
# (columns of W, rows of the proxies); the JSON and the gradients are the single process's
# within f32 rounding (the sums run in another order), checked by numpy-free Python.
python3 - <<'EOF2'
import random
from npy_save import save
rng = random.Random(11)
b, d, c = 37, 8, 11
save("cx.npy", "f", "<f4", (b, d), [rng.uniform(-1, 1) for _ in range(b * d)])
save("cy.npy", "q", "<i8", (b,), [rng.randrange(c - 3) for _ in range(b)])  # 3 classes absent
save("cw.npy", "f", "<f4", (d, c), [rng.uniform(-1, 1) for _ in range(d * c)])
save("cw3.npy", "d", "<f8", (d, 3 * c), [rng.uniform(-1, 1) for _ in range(3 * d * c)])
save("cp.npy", "f", "<f4", (c, d), [rng.uniform(-1, 1) for _ in range(c * d)])
EOF2
close() { # one.npy many.npy: equal within 1e-6 of the largest value
    python3 - "$1" "$2" <<'EOF2' || { echo "FAIL: $1 and $2 differ"; exit 1; }
import struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<H", raw[8:10])[0]
    header, data = raw[10:10 + n].decode(), raw[10 + n:]
    shape = header.split("'shape': (")[1].split(")")[0]
    return shape, struct.unpack("<%df" % (len(data) // 4), data)
(sa, a), (sb, b) = load(sys.argv[1]), load(sys.argv[2])
top = max(abs(v) for v in a)
assert sa == sb, (sa, sb)
assert all(abs(x - y) <= 1e-6 * max(top, 1e-3) for x, y in zip(a, b)), max(abs(x - y) for x, y in zip(a, b))
EOF2
}
run_classifier() { # loss weights args...
    local loss="$1" weights="$2"
    shift 2
    "$wml" loss "$loss" --embeddings cx.npy --labels cy.npy --weights "$weights" "$@" \
        --backend cpu --grad-out "one-$loss-g.npy" --weight-grad-out "one-$loss-w.npy" > "one-$loss.json"
    for np in 2 3; do
        "${mpirun[@]}" -np "$np" "$wml" loss "$loss" --embeddings cx.npy --labels cy.npy \
            --weights "$weights" "$@" --backend cpu --distributed \
            --grad-out "$np-$loss-g.npy" --weight-grad-out "$np-$loss-w.npy" > "$np-$loss.json"
        python3 -c 'import json, sys; a, b = (json.load(open(p)) for p in sys.argv[1:]); assert a["count"] == b["count"] and a["classes_used"] == b["classes_used"] and abs(a["loss"] - b["loss"]) <= 1e-6 * abs(a["loss"]), (a, b)' \
            "one-$loss.json" "$np-$loss.json" || { echo "FAIL: $loss JSON differs"; exit 1; }
        close "one-$loss-g.npy" "$np-$loss-g.npy"
        close "one-$loss-w.npy" "$np-$loss-w.npy"
    done
    echo "loss $loss: 2 and 3 ranks give the single process's loss and gradients: $(cat "one-$loss.json")"
}
run_classifier arcface cw.npy
run_classifier sub-center-arcface cw3.npy
run_classifier proxy-anchor cp.npy
run_classifier proxy-nca cp.npy
# PartialFC's sampling: the draw is the class's, so the ranks draw what one process draws.
run_classifier cosface cw.npy --sample-rate 0.3 --seed 2
