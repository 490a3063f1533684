#!/usr/bin/env python3
"""Side-by-side kNN benchmark: this library (native CPU and lavapipe paths) against
Faiss and pytorch-metric-learning (`shared/anchors/bench_knn.py`), in one run on one machine,
every timed process under `flock /tmp/bench.lock`.

Needs the anchors' venv (see ../shared/anchors/README.md); not part of CI.

    cargo build --release --example bench_knn
    ~/.cache/wml-anchor-venv/bin/python benches/compare_knn.py --reps 3 --wgpu-reps 1 > bench-knn.md

The lavapipe runs take minutes each (10k x 100k x 128 at a few GFLOP/s); `--wgpu-reps 0` skips
them. Raw JSON lines go to stderr.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import result, secs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")
OURS = os.path.join(ROOT, "target", "release", "examples", "bench_knn")
FLOP = 2 * 10_000 * 100_000 * 128
# lavapipe runs of the full case take minutes.
TIMEOUT = 3600


def anchor(func, reps):
    return result([sys.executable, os.path.join(ANCHORS, "bench_knn.py"), "--worker", "--func", func,
                   "--reps", str(reps)], TIMEOUT)


def ours(path, func, reps, k=None):
    cmd = [OURS, "--path", path, "--func", func, "--reps", str(reps)]
    if k is not None:
        cmd += ["--k", str(k)]
    return result(cmd, TIMEOUT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--wgpu-reps", type=int, default=1)
    a = ap.parse_args()
    print("| case | implementation | median s | GFLOP/s | × Faiss | × PML | peak RSS MiB | peak device MiB (budget) | check |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in (10, 100):
        faiss = anchor(f"faiss_flatip_k{k}", a.reps)
        pml = anchor(f"customknn_b1024_k{k}", a.reps)
        rows = [("Faiss IndexFlatIP", faiss), ("PML CustomKNN(batch 1024)", pml),
                ("ours native", ours("cpu", "knn", a.reps, k))]
        if a.wgpu_reps > 0:
            rows.append(("ours lavapipe", ours("wgpu", "knn", a.wgpu_reps, k)))
        for name, rec in rows:
            s = secs(rec)
            ratio = lambda other: f"{secs(other) / s:.2f}" if s and secs(other) else "–"
            check = rec.get("recall_vs_f64_first50", rec.get("recall_vs_float64_first200", "–"))
            dev = f"{rec['peak_device_mib']} ({rec['budget_mib']})" if "peak_device_mib" in rec else "–"
            print(f"| kNN 10k × 100k × 128, k = {k}, cosine | {name} | {s if s is None else f'{s:.3f}'} | "
                  f"{FLOP / s / 1e9 if s else 0:.1f} | {ratio(faiss)} | {ratio(pml)} | {rec.get('peak_rss_mb', '–')} | {dev} | recall {check} |",
                  flush=True)
    # Accuracy is compared on identical arrays (PML's AccuracyCalculator with Faiss and with
    # our KNN, our accuracy from Python and the CLI) in compare_python.py: this script's
    # accuracy rows used to feed PML and the library different samples.


if __name__ == "__main__":
    main()
