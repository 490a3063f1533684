#!/usr/bin/env python3
"""k-means and NMI/AMI side by side with Faiss and PML, on identical arrays, in one run on one
machine (every timed process under `flock /tmp/bench.lock`, one worker process per case, two
threads each):

- k-means of 100 000 × 128 into 1 000 clusters, 20 iterations: `faiss.Kmeans(niter=20)` and
  its `index.search(x, 1)` (what PML's `FaissKMeans` runs) against `wgpu_metric_learning.kmeans`,
  on unstructured data (Gaussian noise: no fixed point, every iteration runs) and on
  clustered data (1 000 blobs: ours stops at the fixed point, Faiss runs all 20).
- NMI and AMI on 20 000 × 128, 100 classes: PML's `AccuracyCalculator(include=("NMI",
  "AMI"))` (Faiss k-means, scikit-learn scores) against `wgpu_metric_learning.accuracy(...,
  include=["NMI", "AMI"])`, over several datasets (both k-means start at random), and the
  spread of NMI over k-means seeds on one dataset, Faiss's and ours.

Needs the Python venv of python/requirements-test.txt with the package installed in release
mode (`cd python && maturin develop --release`); not part of CI:

    ~/.cache/wml-py-venv/bin/python benches/compare_clustering.py --reps 3 > bench-clustering.md

Raw JSON lines go to stderr. `--openblas-coretype X` adds a Faiss row with
`OPENBLAS_CORETYPE=X`: the OpenBLAS inside the faiss-cpu wheel picks its GEMM kernel by CPU
model and falls back to a generic SSE3 one ("Prescott") on CPUs newer than it knows, which
makes Faiss ~4× slower there; the extra row is Faiss with the kernel it should have picked.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

N, D, K = 100_000, 128, 1_000
ACC_N, ACC_CLASSES = 20_000, 100


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def kmeans_data(kind):
    import numpy as np

    rng = np.random.default_rng(0)
    if kind == "noise":
        return rng.normal(0, 1, (N, D)).astype(np.float32)
    centres = rng.normal(0, 1, (K, D))
    return (centres[rng.integers(0, K, N)] + rng.normal(0, 0.5, (N, D))).astype(np.float32)


def accuracy_data(seed):
    import numpy as np

    rng = np.random.default_rng(100 + seed)
    centres = rng.normal(0, 1, (ACC_CLASSES, D))
    labels = np.arange(ACC_N) % ACC_CLASSES
    x = centres[labels] + rng.normal(0, 0.9, (ACC_N, D))
    return x.astype(np.float32), labels.astype(np.int64)


def worker(a):
    import faiss
    import numpy as np

    import wgpu_metric_learning as wml

    faiss.omp_set_num_threads(2)
    rec = {"func": a.func, "data": a.data, "seed": a.seed}
    timings = []
    if a.func.startswith("kmeans_"):
        x = kmeans_data(a.data)
        ctx = wml.Context(backend=a.backend)
        for _ in range(a.reps):
            t = time.perf_counter()
            if a.func == "kmeans_faiss":
                km = faiss.Kmeans(D, K, niter=20, seed=1234)
                km.train(x)
                dist, _ = km.index.search(x, 1)
                inertia, iterations = float(dist.astype(np.float64).sum()), 20
            else:
                out = wml.kmeans(ctx, x, K, max_iterations=20)
                inertia, iterations = out.inertia, out.iterations
            timings.append(time.perf_counter() - t)
        rec.update(inertia=inertia, iterations=iterations)
    else:
        import torch

        torch.set_num_threads(2)
        x, y = accuracy_data(a.seed)
        for _ in range(a.reps):
            t = time.perf_counter()
            if a.func == "nmi_pml":
                from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

                calc = AccuracyCalculator(include=("NMI", "AMI"), device=torch.device("cpu"))
                m = calc.get_accuracy(torch.from_numpy(x), torch.from_numpy(y))
            else:
                ctx = wml.Context(backend=a.backend)
                m = wml.accuracy(ctx, x, y, include=["NMI", "AMI"], kmeans_seed=1234 + a.seed).metrics
            timings.append(time.perf_counter() - t)
        rec.update(nmi=float(m["NMI"]), ami=float(m["AMI"]))
    rec.update(seconds=timings, peak_rss_mib=peak_rss_mib())
    print(json.dumps(rec))


def seed_spread(seeds, backend):
    """NMI of one dataset's k-means over `seeds` k-means seeds, Faiss's and ours: how much of
    a difference between two single draws is the randomness of k-means itself."""
    import faiss
    import numpy as np
    from sklearn.metrics import normalized_mutual_info_score

    import wgpu_metric_learning as wml

    faiss.omp_set_num_threads(2)
    x, y = accuracy_data(0)
    ctx = wml.Context(backend=backend)
    theirs, ours = [], []
    for s in range(seeds):
        km = faiss.Kmeans(D, ACC_CLASSES, niter=20, seed=1234 + s)
        km.train(x)
        theirs.append(normalized_mutual_info_score(y, km.index.search(x, 1)[1][:, 0]))
        ours.append(wml.accuracy(ctx, x, y, include=["NMI"], kmeans_seed=1234 + s).metrics["NMI"])
    return (float(np.mean(theirs)), float(np.std(theirs))), (float(np.mean(ours)), float(np.std(ours)))


def launch(func, data, seed, reps, backend, coretype=None):
    cmd = ["flock", "/tmp/bench.lock", sys.executable, __file__, "--worker", func, "--data", data,
           "--seed", str(seed), "--reps", str(reps), "--backend", backend]
    env = dict(os.environ)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"func": func, "failed": p.returncode, "stderr": p.stderr[-400:]}
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(rec), file=sys.stderr)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--data", default="noise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--openblas-coretype")
    a = ap.parse_args()
    if a.worker:
        a.func = a.worker
        return worker(a)
    print(f"| k-means {N} × {D}, {K} clusters | implementation | median s | iterations | "
          "inertia | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for data in ("noise", "blobs"):
        recs = {f: launch(f, data, 0, a.reps, a.backend) for f in ("kmeans_faiss", "kmeans_ours")}
        if a.openblas_coretype:
            recs[f"kmeans_faiss OPENBLAS_CORETYPE={a.openblas_coretype}"] = launch(
                "kmeans_faiss", data, 0, a.reps, a.backend, a.openblas_coretype)
        for f, rec in recs.items():
            if "failed" in rec:
                print(f"| {data} | {f} | failed (exit {rec['failed']}) | | | |")
                continue
            print(f"| {data} | {f} | {statistics.median(rec['seconds']):.2f} | "
                  f"{rec['iterations']} | {rec['inertia']:.6g} | {rec['peak_rss_mib']:.0f} |")
        ours = recs["kmeans_ours"]
        for f, rec in recs.items():
            if f.startswith("kmeans_faiss") and "failed" not in rec and "failed" not in ours:
                ratio = statistics.median(rec["seconds"]) / statistics.median(ours["seconds"])
                print(f"| {data} | ours vs {f} | {ratio:.2f}× | | | |")
    print()
    print(f"| NMI/AMI {ACC_N} × {D}, {ACC_CLASSES} classes, seed | PML NMI | ours NMI | PML AMI | "
          "ours AMI | PML s | ours s |")
    print("|---|---|---|---|---|---|---|")
    diffs = []
    for seed in range(a.seeds):
        p = launch("nmi_pml", "", seed, 1, a.backend)
        o = launch("nmi_ours", "", seed, 1, a.backend)
        if "failed" in p or "failed" in o:
            print(f"| {seed} | failed: {p.get('failed')} {o.get('failed')} | | | | | |")
            continue
        diffs.append((o["nmi"] - p["nmi"], o["ami"] - p["ami"]))
        print(f"| {seed} | {p['nmi']:.4f} | {o['nmi']:.4f} | {p['ami']:.4f} | {o['ami']:.4f} | "
              f"{p['seconds'][0]:.2f} | {o['seconds'][0]:.2f} |")
    if diffs:
        mean = [statistics.mean(d[i] for d in diffs) for i in (0, 1)]
        worst = [max(abs(d[i]) for d in diffs) for i in (0, 1)]
        print(f"| mean difference (ours − PML) | NMI {mean[0]:+.4f} | worst {worst[0]:.4f} | "
              f"AMI {mean[1]:+.4f} | worst {worst[1]:.4f} | | |")
    (tm, ts), (om, os_) = seed_spread(8, a.backend)
    print()
    print(f"NMI of dataset 0 over 8 k-means seeds: Faiss {tm:.4f} ± {ts:.4f}, "
          f"ours {om:.4f} ± {os_:.4f} (mean ± standard deviation).")


if __name__ == "__main__":
    main()
