#!/usr/bin/env bash
# The one-command GPU report: the whole test suite on a hardware adapter, then the distance,
# kNN, mining and memory-bank benchmarks, as one Markdown table (device, driver, GFLOP/s, % of
# fp32 peak, host waits per operation, ratios to pytorch-metric-learning on CUDA where torch
# is there).
#
#   benches/gpu-report.sh build          # here, with the toolchain: fills .devbin/, .gl/, .whl/
#   benches/gpu-report.sh run [--quick]  # there, from the project root, with them carried
#   benches/gpu-report.sh core [--quick] | pairs [--quick] | hunt | hunt-parallel | prepare
#                                        # see each below
#
# `build` compiles the test binaries (`cargo test --release --no-run`: the integration tests
# are one binary, plus the library's unit tests), the bench examples and `wml` in release,
# strips them into .devbin/, fetches the Vulkan/EGL loaders as .deb files into .gl/ and PML's
# pure-Python wheel into .whl/ (both only if missing), and checks that what travels stays under
# the 64 MiB a GPU server is sent (see shared/device.md). `run` needs no Rust toolchain: it
# unpacks the loaders, runs the tests with WML_REQUIRE_GPU=1 (a missing adapter fails), the
# benches with `--path wgpu`, PML on CUDA if `python3` has torch, and writes everything plus
# report.md to $OUT (else ./gpu-report-out), printing the report last. `--quick` runs small
# cases (to check the script itself on any adapter, lavapipe included).
#
# Each test runs in a process of its own, WML_TEST_THREADS (4) at a time, each stopped after
# WML_TEST_TIMEOUT seconds (60), so that one that hangs is named and stops nothing else: on
# an H200 the integration tests hung in one process after 31 tests, where each alone passed.
# Each binary then runs whole once more (WML_INPROCESS_TIMEOUT seconds, 120), reported apart.
# WML_TEST_ISOLATED=0 runs each binary whole instead (WML_TEST_TIMEOUT then per binary, 0 =
# none).
set -euo pipefail
cd "$(dirname "$0")/.."

BENCHES=(bench_report bench_knn bench_mining bench_bank bench_gemm bench_classifier)
LIMIT_MIB=56

build() {
    # Test binaries: their paths come from cargo's JSON messages.
    local tests
    tests=$(cargo test --release --no-run --lib --test root --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])')
    cargo build --release --bins --examples
    rm -rf .devbin && mkdir -p .devbin
    while read -r name exe; do
        cp "$exe" ".devbin/test-$name"
    done <<<"$tests"
    for b in "${BENCHES[@]}"; do cp "target/release/examples/$b" .devbin/; done
    cp target/release/wml .devbin/
    # The test binaries keep their symbol tables (not their debug info): the hunt's stacks
    # then name our functions and the tests that were running.
    strip .devbin/bench_* .devbin/wml
    strip --strip-debug .devbin/test-*
    # Where the tests were built: they find their fixtures and `wml` under this path.
    pwd >.devbin/BUILD_ROOT
    # Packed with xz (a quarter of the size: what travels is limited); `prepare` unpacks.
    (cd .devbin && tar -cf - --exclude=BUILD_ROOT -- * | xz -T2 -6 >bins.tar.xz.part &&
        find . -maxdepth 1 -type f ! -name BUILD_ROOT ! -name 'bins.tar.xz.part' -delete &&
        mv bins.tar.xz.part bins.tar.xz)
    if ! ls .gl/*.deb >/dev/null 2>&1; then
        mkdir -p .gl /tmp/amd64/partial
        local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
        # shellcheck disable=SC2086
        apt-get $o update >/dev/null
        # shellcheck disable=SC2086
        (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    fi
    # gdb and eu-stack for the hunt's stacks, as Debian packages run from a directory of their
    # own there (gdb-minimal needs libdebuginfod, whose stand-in is built here).
    if ! ls .gl/dbg/*.deb >/dev/null 2>&1; then
        mkdir -p .gl/dbg /tmp/amd64/partial
        local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
        # shellcheck disable=SC2086
        apt-get $o update >/dev/null
        # shellcheck disable=SC2086
        (cd .gl/dbg && apt-get $o download gdb-minimal libipt2 libxxhash0 libgmp10 libexpat1 \
            libreadline8 libtinfo6 elfutils libdw1 libelf1 libasm1 libbz2-1.0 libzstd1 liblzma5 \
            zlib1g libstdc++6 libgcc-s1)
    fi
    gcc -O2 -shared -fPIC -Wl,--version-script=benches/hunt/debuginfod_stub.map \
        -Wl,-soname,libdebuginfod.so.1 -o .gl/dbg/libdebuginfod.so.1 benches/hunt/debuginfod_stub.c
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip download -q --no-deps pytorch-metric-learning==2.9.0 -d .whl ||
            echo "gpu-report: no PML wheel (the report will have no PML ratios)" >&2
    fi
    local mib
    mib=$(du -scm .devbin .gl .whl 2>/dev/null | tail -1 | cut -f1)
    ls -la .devbin
    xz -dc .devbin/bins.tar.xz | tar -tvf -
    echo "gpu-report: .devbin + .gl + .whl = ${mib} MiB (limit ${LIMIT_MIB})"
    if [ "$mib" -gt "$LIMIT_MIB" ]; then
        echo "gpu-report: too large to carry" >&2
        exit 1
    fi
    echo "gpu-report: now run 'benches/gpu-report.sh run' there, carrying .devbin .gl .whl"
}

# What both `run` and `hunt` need there: the Vulkan/EGL loaders unpacked, the NVIDIA ICD named
# when the loader would not find it, the device's name and driver in $1/gpu.txt, and the build
# path the tests read their fixtures from pointed at this checkout.
prepare() {
    local out=$1
    if [ -f .devbin/bins.tar.xz ] && [ ! -x .devbin/wml ]; then
        if command -v xz >/dev/null; then
            xz -dc .devbin/bins.tar.xz | tar -C .devbin -xf -
        else
            python3 -c 'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(".devbin")' \
                .devbin/bins.tar.xz
        fi
    fi
    if ls .gl/*.deb >/dev/null 2>&1 && ! ldconfig -p | grep -q libvulkan.so.1; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
    fi
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if [ -f "$icd" ] && [ -z "${VK_DRIVER_FILES:-}" ] &&
        ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
        export VK_DRIVER_FILES=$icd
        export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    fi
    export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
    fi
    # The tests read fixtures under the path they were built in, and run `wml` from its target
    # directory there: point that path here.
    local root
    root=$(cat .devbin/BUILD_ROOT)
    if [ "$root" != "$PWD" ] && [ ! -e "$root" ]; then
        mkdir -p "$(dirname "$root")"
        ln -s "$PWD" "$root"
    fi
    mkdir -p "$root/target/release"
    [ -e "$root/target/release/wml" ] || cp .devbin/wml "$root/target/release/wml"
}

run() {
    local quick=${1:-}
    local out=${OUT:-$PWD/gpu-report-out}
    mkdir -p "$out"
    prepare "$out"

    : >"$out/tests.log"
    for t in .devbin/test-*; do
        echo "== $t" | tee -a "$out/tests.log"
        if [ "${WML_TEST_ISOLATED:-1}" = 1 ]; then
            isolated "$t" "$out/tests.log"
            # Then the binary whole, several tests at once, as users run it: whether the
            # hang of 2026-11-26 is gone. Reported, not counted in the verdict.
            local whole=0
            WML_REQUIRE_GPU=1 WML_SOAK_SECS=${WML_SOAK_SECS:-10} timeout -k 5 "${WML_INPROCESS_TIMEOUT:-120}" \
                "$t" --test-threads="${WML_TEST_THREADS:-4}" >"$out/inprocess.log" 2>&1 || whole=$?
            echo "in one process ($(basename "$t")): exit $whole, $(grep -c ' ok$' "$out/inprocess.log") tests ok" |
                tee -a "$out/tests.log"
            continue
        fi
        local rc=0
        WML_REQUIRE_GPU=1 WML_SOAK_SECS=${WML_SOAK_SECS:-10} timeout -k 5 "${WML_TEST_TIMEOUT:-0}" \
            "$t" --test-threads="${WML_TEST_THREADS:-4}" >>"$out/tests.log" 2>&1 || rc=$?
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            echo "test result: FAILED. 0 passed; 1 failed; 0 ignored (the binary timed out)" >>"$out/tests.log"
        fi
        grep -E '^test result|FAILED|panicked' "$out/tests.log" | tail -3 || true
    done

    local q=10000 n=100000 mining=("128 4096 100 miner_semihard" "1000 1000 100 miner_hard"
        "21 10000 100 lmu" "512 2000 10 miner_semihard") bank_m=4096 reps=3
    local losses=("128 4096 10 all" "128 4096 10 semihard" "128 65536 10 all") infonce_b=4096
    if [ "$quick" = --quick ]; then
        q=500 n=5000 mining=("64 512 10 miner_semihard" "21 1000 10 lmu") bank_m=512 reps=1
        losses=("64 512 10 all") infonce_b=256
    fi
    .devbin/bench_report | tee "$out/distance.md"
    : >"$out/results.jsonl"
    for k in 10 100; do
        .devbin/bench_knn --func knn --path wgpu --Q $q --N $n --k $k --reps $reps | tee -a "$out/results.jsonl"
    done
    local pml_cases=()
    for c in "${mining[@]}"; do
        read -r b m cl func <<<"$c"
        .devbin/bench_mining --path wgpu --func "$func" --B "$b" --M "$m" --C "$cl" --reps $reps |
            tee -a "$out/results.jsonl"
        pml_cases+=("$b,$m,$cl,${func#miner_}")
    done
    .devbin/bench_bank --path wgpu --func cbm_semihard --M $bank_m --C 100 --reps $reps |
        tee -a "$out/results.jsonl"
    # The triplet loss with its gradient (issue 20's targets), on the adapter and on the
    # native path, against PML's TripletMarginLoss on CUDA.
    local loss_cases=()
    for c in "${losses[@]}"; do
        read -r b m cl kind <<<"$c"
        for path in wgpu cpu; do
            .devbin/bench_mining --path $path --func "loss_triplet_$kind" --B "$b" --M "$m" --C "$cl" \
                --budget-mib 1024 --reps $reps | tee -a "$out/results.jsonl"
        done
        loss_cases+=("$b,$m,$cl,$kind")
    done
    for func in loss_ntxent loss_mnrl; do
        for path in wgpu cpu; do
            .devbin/bench_mining --path $path --func $func --B "$infonce_b" --D 768 --budget-mib 1024 \
                --reps $reps | tee -a "$out/results.jsonl"
        done
    done


    pml_cuda --Q $q --N $n --reps $reps --mining "${pml_cases[@]}" --loss "${loss_cases[@]}" \
        --infonce "$infonce_b,768" | tee "$out/pml.jsonl" || true
    pair_losses "$out" $reps "$quick"
    classifier_losses "$out" $reps "$quick"
    python3 benches/gpu_report.py "$out" >"$out/report.md"
    cat "$out/report.md"
}

# Each test of binary $1 in a process of its own, WML_TEST_THREADS at a time, each stopped after
# WML_TEST_TIMEOUT seconds (60 if unset or 0): a test that hangs a device or deadlocks cannot
# stop the others, and is named. Appends each failure's output and a libtest-style summary
# (timeouts counted as failures) to $2.
isolated() {
    local t=$1 log=$2 dir
    dir=$(mktemp -d)
    "$t" --list 2>/dev/null | sed -n 's/: test$//p' >"$dir/list"
    local limit=${WML_TEST_TIMEOUT:-60}
    [ "$limit" = 0 ] && limit=60
    # shellcheck disable=SC2016
    T=$t D=$dir L=$limit xargs -P "${WML_TEST_THREADS:-4}" -I{} sh -c \
        'WML_REQUIRE_GPU=1 WML_SOAK_SECS=${WML_SOAK_SECS:-10} timeout -k 5 "$L" "$T" --exact "$1" \
            --test-threads=1 >"$D/$1.log" 2>&1; echo "$? $1"' _ {} <"$dir/list" | sort -k2 >"$dir/rc"
    local passed=0 failed=0 ignored=0 rc name
    while read -r rc name; do
        if [ "$rc" = 0 ]; then
            if grep -q '1 ignored' "$dir/$name.log"; then ignored=$((ignored + 1)); else passed=$((passed + 1)); fi
        else
            failed=$((failed + 1))
            case $rc in 124 | 137) echo "TIMED OUT ($rc): $name" ;; *) echo "FAILED ($rc): $name" ;; esac | tee -a "$log"
            tail -40 "$dir/$name.log" >>"$log"
        fi
    done <"$dir/rc"
    local verdict=ok
    [ "$failed" = 0 ] || verdict=FAILED
    echo "test result: $verdict. $passed passed; $failed failed; $ignored ignored (isolated)" | tee -a "$log"
    rm -rf "$dir"
}

# benches/pml_cuda.py with "$@", PML's wheel from .whl/ on its path, where python3 has torch;
# nothing (and a note) otherwise.
pml_cuda() {
    if ! python3 -c 'import torch' 2>/dev/null; then
        echo "gpu-report: no torch here, no PML/torch comparison" >&2
        return 0
    fi
    local site=/tmp/wml-pml-site
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || true
    fi
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 benches/pml_cuda.py "$@"
}

# PML's pair losses with their gradient on the adapter (pair_weights), on the native path and
# in PML on CUDA (appended to $OUT/results.jsonl and $OUT/pml.jsonl): B = 256 against M =
# 4 096 references, and Lifted, Histogram (on the device only in-batch) and Instance (PML
# refuses its references) over 4 096 rows.
# Each wgpu case also once with every kernel's time (`--kernel-timing`). Called by `run`, or
# alone as `pairs` (about a minute on an H100).
pair_losses() {
    local out=$1 reps=$2 quick=${3:-}
    local names=(contrastive multi_similarity supcon circle nca generalized_lifted margin fast_ap tcm
        ranked_list intra_pair_variance)
    local b=256 m=4096 batch=4096 cases=() pml=()
    if [ "$quick" = --quick ]; then b=64 m=512 batch=256; fi
    for nm in "${names[@]}"; do cases+=("$nm $b $m"); done
    cases+=("lifted $batch 0" "histogram $batch 0" "instance $batch 0")
    for c in "${cases[@]}"; do
        read -r nm cb cm <<<"$c"
        for path in wgpu cpu; do
            .devbin/bench_mining --path $path --func "loss_pair_$nm" --B "$cb" --M "$cm" --C 100 \
                --budget-mib 1024 --reps "$reps" | tee -a "$out/results.jsonl"
        done
        .devbin/bench_mining --path wgpu --func "loss_pair_$nm" --B "$cb" --M "$cm" --C 100 \
            --budget-mib 1024 --reps 1 --kernel-timing | tee -a "$out/kernels.jsonl"
        pml+=("$nm,$cb,$cm,100")
    done
    pml_cuda --Q 0 --N 0 --k "" --reps "$reps" --pair "${pml[@]}" | tee -a "$out/pml.jsonl" || true
}

# PML's losses with class weights that run on the device (ArcFace, CosFace, NormalizedSoftmax,
# ProxyNCA), forward and both gradients at the issue's shape (B = 512, D = 512, C = 100 000),
# on the adapter and natively, and PML on CUDA beside them (appended to $OUT/results.jsonl and
# $OUT/pml.jsonl).
classifier_losses() {
    local out=$1 reps=$2 quick=${3:-}
    local b=512 d=512 c=100000 pml=()
    if [ "$quick" = --quick ]; then b=64 d=64 c=2000; fi
    for kind in arcface cosface normalized_softmax proxy_nca; do
        for path in wgpu cpu; do
            .devbin/bench_classifier --path $path --kind $kind --B $b --D $d --C $c \
                --reps "$reps" --budget-mib 4096 | tee -a "$out/results.jsonl"
        done
        pml+=("$kind,$b,$d,$c")
    done
    pml_cuda --Q 0 --N 0 --k "" --reps "$reps" --classifier "${pml[@]}" | tee -a "$out/pml.jsonl" || true
}

pairs() {
    local out=${OUT:-$PWD/gpu-report-out}
    mkdir -p "$out"
    prepare "$out"
    pair_losses "$out" 3 "${1:-}"
    classifier_losses "$out" 3 "${1:-}"
    python3 benches/gpu_report.py "$out" >"$out/report.md" || true
    cat "$out/report.md"
}

# The GPU core's figures, quickly (about 2 minutes on an H100): the FMA-loop and copy peaks,
# the distance GEMM of every variant checked and trusted with its kernel time by timestamps,
# the tuner's choice, kNN 10 000 x 100 000 x 128 with every kernel's time (k = 10 and 100,
# end to end), NTXent and MNRL at B = 4 096, d = 768, and torch/PML on CUDA beside them
# (cuBLAS fp32 GEMM, CustomKNN, the full-matrix losses). Writes $OUT/results.jsonl,
# $OUT/pml.jsonl and $OUT/report.json (`benches/gpu_report.py --json`). `--quick`: small
# shapes, to check the script on any adapter.
core() {
    local quick=${1:-}
    local out=${OUT:-$PWD/gpu-report-out}
    mkdir -p "$out"
    prepare "$out"
    export WML_TUNE_CACHE=${WML_TUNE_CACHE:-/tmp/wml-tune.tsv}
    local q=10000 n=100000 reps=3 infonce_b=4096 gemm_args=()
    if [ "$quick" = --quick ]; then
        q=500 n=5000 reps=1 infonce_b=256 gemm_args=(--quick)
    fi
    : >"$out/results.jsonl"
    .devbin/bench_gemm "${gemm_args[@]}" --knn "${q}x${n}x128" | tee -a "$out/results.jsonl"
    for k in 10 100; do
        .devbin/bench_knn --func knn --path wgpu --Q $q --N $n --k $k --reps $reps | tee -a "$out/results.jsonl"
    done
    for func in loss_ntxent loss_mnrl; do
        .devbin/bench_mining --path wgpu --func $func --B "$infonce_b" --D 768 --budget-mib 1024 \
            --reps $reps | tee -a "$out/results.jsonl"
    done
    pml_cuda --Q $q --N $n --reps $reps --infonce "$infonce_b,768" \
        --gemm 2048,16384,128 "$q,$n,128" | tee "$out/pml.jsonl" || true
    python3 benches/gpu_report.py --json "$out" >"$out/report.json" || true
}

# The in-process hunt (the hang and the crash of the unit tests in one process on NVIDIA):
# test binaries run whole, many times, at HUNT_THREADS (8) threads, as a user's process
# would, each run under a watchdog. A run that outlives its limit is a hang: every thread's
# backtrace is taken (gdb attached, else eu-stack, else /proc's wchan and syscall) before it
# is killed. A run that dies of a signal leaves a core where the kernel allows one, read by
# gdb; where it does not, the stage's later runs go under gdb, which prints every thread's
# stack at the fault.
#
# Stages, in order (runs and seconds per run as HUNT_<STAGE>_RUNS / _LIMIT):
#   first-off    the test whose child processes make their first contexts on 8 threads at
#                once (WML_FIRST_CONTEXT_RUNS, 10, children per run), with the library's
#                lifecycle guard off (WML_DEVICE_LOCK=off): whether the driver's fault
#                shows without it (2 runs, 120 s)
#   first        the same with the guard, as shipped (2 runs, 120 s)
#   churn-off    the stress test of contexts made and dropped beside running kernels,
#                guard off (0 runs: it never failed on an H200), and
#   churn        with the guard (2 runs, 60 s)
#   exit-off     the test whose child processes exit holding a context (WML_EXIT_RUNS, 20,
#                children per run), with the exit's teardown off (WML_EXIT_TEARDOWN=off):
#                whether the driver's fault at exit shows without it (1 run, 120 s)
#   exit         the same with the teardown, as shipped (1 run, 120 s)
#   unit         the library's unit tests (20 runs, 45 s)
#   integration  the integration tests (10 runs, 240 s)
# A stage is skipped once a run would end past HUNT_DEADLINE (420) seconds from the start.
# Writes $OUT/hunt.jsonl (rows `inprocess-<stage>`: runs, passed, hangs, crashes, threads,
# device, driver), $OUT/hunt-summary.txt, and every run's log and stacks packed in
# $OUT/hunt.tar.gz (rewritten after each run, so that a run cut short still returns them).
# With HUNT_BISECT=1 and time left, a failing binary's top-level modules then run alone,
# HUNT_BISECT_RUNS (5) times each. HUNT_STAGES (a space-separated list of labels) runs only
# those stages; HUNT_TAG names this hunt's files (hunt-<tag>.jsonl, …) so that hunts can run
# side by side (`hunt-parallel`).
hunt() {
    local out=${OUT:-$PWD/gpu-report-out} tag=${HUNT_TAG:+-$HUNT_TAG}
    local work=/tmp/wml-hunt$tag
    rm -rf "$work" && mkdir -p "$work" "$out"
    prepare "$out"
    local started=$SECONDS deadline=${HUNT_DEADLINE:-420} threads=${HUNT_THREADS:-8}
    # Contexts per churning thread of the stress test (4 threads).
    export WML_CHURN_CONTEXTS=${WML_CHURN_CONTEXTS:-25}
    # Child processes per run of the first-contexts test.
    export WML_FIRST_CONTEXT_RUNS=${WML_FIRST_CONTEXT_RUNS:-10}
    debuggers
    ulimit -c unlimited 2>/dev/null || true
    {
        echo "core_pattern: $(cat /proc/sys/kernel/core_pattern 2>/dev/null)"
        echo "gdb: ${GDB[*]:-none}; eu-stack: ${EUSTACK[*]:-none}"
        cat "$out/gpu.txt" 2>/dev/null || true
    } | tee "$work/env.txt"
    local device driver
    device=$(cut -d, -f1 "$out/gpu.txt" 2>/dev/null | xargs || true)
    driver=$(cut -d, -f2 "$out/gpu.txt" 2>/dev/null | xargs || true)
    : >"$out/hunt$tag.jsonl"
    local spec label bin runs limit lock filter failing=()
    # Children per run of the exit test (a context held through the exit).
    export WML_EXIT_RUNS=${WML_EXIT_RUNS:-20}
    for spec in \
        "first-off test-root ${HUNT_FIRST_OFF_RUNS:-2} ${HUNT_FIRST_OFF_LIMIT:-120} off auto concurrency::first_contexts" \
        "first test-root ${HUNT_FIRST_RUNS:-2} ${HUNT_FIRST_LIMIT:-120} on auto concurrency::first_contexts" \
        "churn-off test-root ${HUNT_CHURN_OFF_RUNS:-0} ${HUNT_CHURN_OFF_LIMIT:-60} off auto concurrency::contexts_made_and_dropped" \
        "churn test-root ${HUNT_CHURN_RUNS:-2} ${HUNT_CHURN_LIMIT:-60} on auto concurrency::contexts_made_and_dropped" \
        "exit-off test-root ${HUNT_EXIT_OFF_RUNS:-1} ${HUNT_EXIT_OFF_LIMIT:-120} on off concurrency::devices_still_in_use_at_exit" \
        "exit test-root ${HUNT_EXIT_RUNS:-1} ${HUNT_EXIT_LIMIT:-120} on auto concurrency::devices_still_in_use_at_exit" \
        "unit test-wgpu_metric_learning ${HUNT_UNIT_RUNS:-20} ${HUNT_UNIT_LIMIT:-45} on auto" \
        "integration test-root ${HUNT_INTEGRATION_RUNS:-10} ${HUNT_INTEGRATION_LIMIT:-240} on auto"; do
        read -r label bin runs limit lock teardown filter <<<"$spec"
        [ -x ".devbin/$bin" ] && [ "$runs" -gt 0 ] || continue
        [ -z "${HUNT_STAGES:-}" ] || [[ " $HUNT_STAGES " == *" $label "* ]] || continue
        local passed=0 hangs=0 crashes=0 failed=0 done_runs=0 under_gdb=0 i status
        for ((i = 1; i <= runs; i++)); do
            if [ $((SECONDS - started + limit)) -gt "$deadline" ]; then
                echo "hunt: deadline, $label stopped after $done_runs runs" | tee -a "$work/summary.txt"
                break
            fi
            status=$(WML_DEVICE_LOCK=$lock WML_EXIT_TEARDOWN=$teardown HUNT_FILTER=$filter \
                hunt_once "$work/$label-$i" ".devbin/$bin" "$limit" "$threads" "$under_gdb")
            done_runs=$((done_runs + 1))
            case $status in
            pass) passed=$((passed + 1)) ;;
            hang) hangs=$((hangs + 1)) ;;
            crash*)
                crashes=$((crashes + 1))
                # No core to read: the next runs go under gdb to catch the next fault.
                [ "$status" = crash-nocore ] && [ ${#GDB[@]} -gt 0 ] && under_gdb=1
                ;;
            *) failed=$((failed + 1)) ;;
            esac
            echo "hunt: $label run $i: $status ($(grep -c ' ok$' "$work/$label-$i/log") tests ok, $(grep -h 'contexts made' "$work/$label-$i/log" | head -1) $((SECONDS - started)) s)" |
                tee -a "$work/summary.txt"
            pack_hunt "$work" "$out" "$tag"
        done
        printf '{"case": "inprocess-%s", "runs": %d, "passed": %d, "hangs": %d, "crashes": %d, "failed": %d, "threads": %d, "device_lock": "%s", "device": "%s", "driver": "%s"}\n' \
            "$label" "$done_runs" "$passed" "$hangs" "$crashes" "$failed" "$threads" "$lock" "$device" "$driver" |
            tee -a "$out/hunt$tag.jsonl"
        [ $((hangs + crashes)) -gt 0 ] && [ -z "$filter" ] && failing+=("$bin $limit")
    done
    if [ "${HUNT_BISECT:-0}" = 1 ]; then
        for spec in "${failing[@]}"; do
            read -r bin limit <<<"$spec"
            bisect_modules "$work" ".devbin/$bin" "$limit" "$threads" "$started" "$deadline" "$tag"
        done
    fi
    pack_hunt "$work" "$out" "$tag"
    cat "$work/summary.txt" 2>/dev/null || true
}

# The hunt's files into $2 (names tagged by $3): its summary, and everything packed (a GPU
# server returns only a few files).
pack_hunt() {
    cp "$1/summary.txt" "$2/hunt$3-summary.txt" 2>/dev/null || true
    tar -czf "$2/hunt$3.tar.gz.part" -C "$(dirname "$1")" "$(basename "$1")" &&
        mv "$2/hunt$3.tar.gz.part" "$2/hunt$3.tar.gz"
}

# Hunts side by side on one device, so that both test binaries get their runs in one lease:
# HUNT_PARALLEL lists each hunt's stages, hunts separated by ";" (default "first churn
# exit-off exit unit;integration"), tagged a, b, c, … in that order, each process at
# HUNT_THREADS threads (two processes of 8 threads on a 16-core server). The other processes are load that a
# user's machine may have too; a run's verdict is still its own process's.
hunt_parallel() {
    local out=${OUT:-$PWD/gpu-report-out} stages pids=() tags=(a b c d e f) n=0
    mkdir -p "$out"
    prepare "$out" >/dev/null
    IFS=';' read -r -a stages <<<"${HUNT_PARALLEL:-first churn exit-off exit unit;integration}"
    for s in "${stages[@]}"; do
        # Each hunt's own output kept: on an H200 one of three hunts left no file at all.
        HUNT_TAG=${tags[$n]} HUNT_STAGES=$s hunt >"$out/hunt-${tags[$n]}.log" 2>&1 &
        pids+=($!)
        n=$((n + 1))
    done
    wait "${pids[@]}" || true
    cat "$out"/hunt-*-summary.txt "$out"/hunt-*.jsonl 2>/dev/null || true
}

# GDB and EUSTACK: commands that run gdb and eu-stack, the server's own or the ones `build`
# carried in .gl/dbg (Debian's gdb-minimal and elfutils, with a libdebuginfod stand-in, run
# from /tmp/wml-dbg with their own libraries).
debuggers() {
    GDB=() EUSTACK=()
    local root=/tmp/wml-dbg lib
    if ls .gl/dbg/*.deb >/dev/null 2>&1 && [ ! -d $root ]; then
        for f in .gl/dbg/*.deb; do dpkg -x "$f" $root; done
        cp .gl/dbg/libdebuginfod.so.1 $root/usr/lib/x86_64-linux-gnu/ 2>/dev/null || true
    fi
    lib=$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu
    if command -v gdb >/dev/null; then
        GDB=(gdb)
    elif [ -x $root/usr/bin/gdb ]; then GDB=(env "LD_LIBRARY_PATH=$lib" $root/usr/bin/gdb); fi
    if command -v eu-stack >/dev/null; then
        EUSTACK=(eu-stack)
    elif [ -x $root/usr/bin/eu-stack ]; then EUSTACK=(env "LD_LIBRARY_PATH=$lib" $root/usr/bin/eu-stack); fi
}

# One run of binary $2 at $4 threads under a $3-second watchdog, in directory $1 (under gdb
# when $5 = 1). Prints pass, fail, hang, crash (a core read), crash-nocore or crash-at-exit
# (every test passed, then the process died of a signal).
hunt_once() {
    local dir=$1 bin=$2 limit=$3 threads=$4 gdb=$5 pid target t0=$SECONDS rc=0
    mkdir -p "$dir"
    (
        cd "$dir" || exit 1
        export WML_REQUIRE_GPU=1 WML_SOAK_SECS=${WML_SOAK_SECS:-10} RUST_BACKTRACE=1
        if [ "$gdb" = 1 ]; then
            exec "${GDB[@]}" -q -batch -ex 'set pagination off' -ex 'handle SIGPIPE nostop noprint' \
                -ex run -ex 'info threads' -ex 'thread apply all bt 40' -ex kill \
                --args "$OLDPWD/$bin" --test-threads="$threads" ${HUNT_FILTER:+"$HUNT_FILTER" --nocapture}
        fi
        exec "$OLDPWD/$bin" --test-threads="$threads" ${HUNT_FILTER:+"$HUNT_FILTER" --nocapture}
    ) >"$dir/log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        target=$pid
        [ "$gdb" = 1 ] && target=$(pgrep -P "$pid" | head -1)
        stacks "$target" "$dir"
        # A test that runs itself in child processes: each child's stacks too.
        local child n=0
        for child in $(pgrep -P "$target" 2>/dev/null); do
            n=$((n + 1))
            stacks "$child" "$dir" "child-$n"
        done
        if [ "$gdb" = 1 ]; then
            # gdb stops the program on SIGINT and runs the batch's backtrace commands.
            kill -INT "$target" 2>/dev/null || true
            sleep 10
        fi
        kill -9 "$pid" "$target" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        echo hang
        return
    fi
    wait "$pid" || rc=$?
    echo "exit $rc" >>"$dir/log"
    # Cores of the run's own child processes (a test that runs itself in a child).
    local core n=0
    for core in "$dir"/core*; do
        [ -f "$core" ] && [ ${#GDB[@]} -gt 0 ] || continue
        n=$((n + 1))
        "${GDB[@]}" -q -batch -ex 'info threads' -ex 'thread apply all bt 40' "$bin" "$core" >"$dir/stacks-$n.txt" 2>&1 || true
        rm -f "$core"
    done
    local signalled=0
    # Under gdb the status is gdb's: the signal is in its log.
    if [ "$rc" -gt 128 ] || grep -q 'received signal SIG\|Program terminated with signal' "$dir/log"; then
        signalled=1
    fi
    if grep -q '^test result: ok' "$dir/log" && [ "$signalled" = 0 ] && [ "$rc" -eq 0 ]; then
        echo pass
    elif grep -q '^test result: ok' "$dir/log" && [ "$signalled" = 1 ]; then
        # Every test passed and the process then died of a signal: a fault at exit (on an
        # H200 the driver's threads ran on while the exit unloaded its libraries).
        echo crash-at-exit
    elif grep -q 'hung for [0-9]* s' "$dir/log"; then
        echo hang # a child process of the test
    elif grep -q 'failed (signal: ' "$dir/log"; then
        echo crash # a child process of the test
    elif [ "$signalled" = 1 ]; then
        if [ "$n" -gt 0 ]; then
            echo crash
        elif grep -q 'received signal SIG' "$dir/log"; then
            echo crash # under gdb: the stacks are in the log
        else
            echo crash-nocore
        fi
    else
        echo fail
    fi
}

# Every thread of process $1 into $2/${3:-stacks}.txt: its name, state, kernel wait channel
# and system call, then user-space stacks by gdb (attached) or eu-stack.
stacks() {
    local pid=$1 dir=$2 name=${3:-stacks} task
    {
        for task in /proc/"$pid"/task/*; do
            echo "$(basename "$task") $(cat "$task/comm") state=$(awk '{print $3}' "$task/stat") wchan=$(cat "$task/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$task/syscall" 2>/dev/null)"
        done
        echo
        if [ ${#GDB[@]} -gt 0 ]; then
            timeout 60 "${GDB[@]}" -q -batch -p "$pid" -ex 'set pagination off' -ex 'info threads' \
                -ex 'thread apply all bt 40' 2>&1
        fi
        if [ ${#EUSTACK[@]} -gt 0 ]; then
            timeout 30 "${EUSTACK[@]}" -p "$pid" 2>&1
        fi
    } >"$dir/$name.txt" 2>&1 || true
}

# With failures seen: binary $2's modules (the first path component of its tests; the
# second under kernels:: and ops::),
# each run alone in one process HUNT_BISECT_RUNS (5) times while time remains.
bisect_modules() {
    local dir=$1 bin=$2 limit=$3 threads=$4 started=$5 deadline=$6 tag=$7 m i status
    for m in $("$bin" --list 2>/dev/null | sed -n 's/: test$//p' |
        sed -E 's/^((kernels|ops)::[^:]+|[^:]+)::.*/\1/' | sort -u); do
        local fails=0 n=0
        for ((i = 1; i <= ${HUNT_BISECT_RUNS:-5}; i++)); do
            [ $((SECONDS - started + limit)) -gt "$deadline" ] && break 2
            # A module filter: only tests whose path starts with it (libtest matches substrings).
            status=$(HUNT_FILTER="$m::" hunt_once "$dir/bisect-$m-$i" "$bin" "$limit" "$threads" 0)
            pack_hunt "$dir" "${OUT:-$PWD/gpu-report-out}" "$tag"
            n=$((n + 1))
            [ "$status" = pass ] || fails=$((fails + 1))
        done
        echo "hunt: bisect $(basename "$bin") $m::: $fails of $n runs failed" | tee -a "$dir/summary.txt"
    done
}

case "${1:-}" in
build) build ;;
run) run "${2:-}" ;;
prepare)
    mkdir -p "${OUT:-$PWD/gpu-report-out}"
    prepare "${OUT:-$PWD/gpu-report-out}"
    ;;
hunt) hunt ;;
hunt-parallel) hunt_parallel ;;
core) core "${2:-}" ;;
pairs) pairs "${2:-}" ;;
*)
    echo "usage: benches/gpu-report.sh build | run [--quick] | core [--quick] | pairs [--quick] | hunt | hunt-parallel | prepare" >&2
    exit 2
    ;;
esac
