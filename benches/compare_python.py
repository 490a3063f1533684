#!/usr/bin/env python3
"""The Python package side by side with pytorch-metric-learning and Faiss, on identical arrays,
in one run on one machine (every timed process under `flock /tmp/bench.lock`, one worker
process per case so that its peak RSS is that case's own):

- PML's `AccuracyCalculator` (k = max_bin_count, the five kNN metrics) with its default Faiss
  kNN, with `knn_func=wgpu_metric_learning.pml.KNN()`, and `wgpu_metric_learning.accuracy`
  (all in Rust), at 20 000 and 120 000 points × 128, 100 classes; and the same data through
  the `wml accuracy` CLI (its own `--stats` seconds), for the Python overhead.
- PML's `CrossBatchMemory(TripletMarginLoss, miner=TripletMarginMiner)` at batch 128, memory
  4 096, 10 classes (the case where PML runs out of memory) against the drop-in.

Needs the Python venv of python/requirements-test.txt with the package installed (README),
and the release CLI; not part of CI:

    cargo build --release --bin wml
    ~/.cache/wml-py-venv/bin/python benches/compare_python.py --reps 3 > bench-python.md

Raw JSON lines go to stderr.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLI = os.path.join(ROOT, "target", "release", "wml")
D, CLASSES = 128, 100
KNN_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r",
               "mean_average_precision", "mean_reciprocal_rank")


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def acc_data(n, seed=1):
    """The anchors' accuracy data (shared/anchors/bench_knn.py), at n points."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((CLASSES, D), dtype=np.float32)
    y = rng.integers(0, CLASSES, n)
    x = centers[y] + 2.0 * rng.standard_normal((n, D), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), y


def timed(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, times


def worker(a):
    import numpy as np

    rec = {"func": a.func, "n": a.n}
    if a.func != "acc_wml":  # that one runs without torch, so its RSS is the library's own
        import torch

        torch.set_num_threads(2)
    if a.func.startswith("acc_"):
        x, y = np.load(a.x), np.load(a.y)
        if a.func == "acc_wml":
            import wgpu_metric_learning as wml

            ctx = wml.Context(backend=a.backend)
            rec["path"] = ctx.path

            def fn():
                return wml.accuracy(ctx, x, y, k="max_bin_count").metrics
        else:
            import faiss
            from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

            faiss.omp_set_num_threads(2)
            knn_func = None
            if a.func == "acc_pml_knn":
                from wgpu_metric_learning.pml import KNN

                knn_func = KNN(backend=a.backend)
            calc = AccuracyCalculator(include=KNN_METRICS, k="max_bin_count", knn_func=knn_func,
                                      device=torch.device("cpu"))
            xt, yt = torch.from_numpy(x), torch.from_numpy(y)

            def fn():
                return calc.get_accuracy(xt, yt)
        metrics, times = timed(fn, a.reps)
        rec["metrics"] = {k: float(metrics[k]) for k in KNN_METRICS}
    else:  # cbm_<impl>_<type>
        _, impl, kind = a.func.split("_")
        from pytorch_metric_learning import losses, miners

        g = torch.Generator().manual_seed(0)
        memory, batch, classes = 4096, 128, 10
        if impl == "pml":
            cbm = losses.CrossBatchMemory(losses.TripletMarginLoss(margin=0.2), D, memory_size=memory,
                                          miner=miners.TripletMarginMiner(margin=0.2, type_of_triplets=kind))
        else:
            from wgpu_metric_learning import pml as drop

            cbm = drop.CrossBatchMemory(losses.TripletMarginLoss(margin=0.2), D, memory_size=memory,
                                        miner=drop.TripletMarginMiner(margin=0.2, type_of_triplets=kind,
                                                                      backend=a.backend))
        batches = [(torch.nn.functional.normalize(torch.randn(batch, D, generator=g), dim=1),
                    torch.randint(0, classes, (batch,), generator=g)) for _ in range(a.reps + 1)]
        with torch.no_grad():
            for _ in range(memory // batch):  # fill the memory as training would
                e = torch.nn.functional.normalize(torch.randn(batch, D, generator=g), dim=1)
                if impl == "pml":
                    cbm.add_to_memory(e, torch.randint(0, classes, (batch,), generator=g), batch)
                else:
                    cbm.bank.enqueue(e.numpy(), torch.randint(0, classes, (batch,), generator=g).numpy())
            it = iter(batches)
            try:
                _, times = timed(lambda: float(cbm(*next(it))), a.reps)
            except (RuntimeError, MemoryError) as e:
                rec["failed"] = str(e).splitlines()[0][:160]
                times = []
    rec["times_s"] = times
    rec["median_s"] = statistics.median(times) if times else None
    rec["peak_rss_mib"] = round(peak_rss_mib())
    print("RESULT " + json.dumps(rec), flush=True)


def run(cmd, timeout=3600):
    p = subprocess.run(["flock", "/tmp/bench.lock"] + cmd, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        why = f"exit status {p.returncode}" + (" (SIGKILL: the kernel's OOM killer)" if p.returncode in (137, -9) else "")
        tail = (p.stderr or "").strip().splitlines()
        return {"failed": why + (": " + tail[-1][:160] if tail else ""), "median_s": None}
    rec = json.loads(lines[-1][7:])
    print(json.dumps(rec), file=sys.stderr, flush=True)
    return rec


def cli(x, y, reps):
    """`wml accuracy` on the same files: its own seconds (--stats) and the process's RSS."""
    secs, rss, metrics = [], 0, None
    for _ in range(reps + 1):
        p = subprocess.run(["flock", "/tmp/bench.lock", "/usr/bin/time", "-f", "RSS %M", CLI, "accuracy",
                            "--embeddings", x, "--labels", y, "--k", "max_bin_count", "--no-normalize",
                            "--backend", "cpu", "--stats"], capture_output=True, text=True, check=True)
        metrics = json.loads(p.stdout)
        for line in p.stderr.splitlines():
            if line.startswith("RSS "):
                rss = max(rss, int(line.split()[1]) // 1024)
            elif line.startswith("{"):
                secs.append(json.loads(line)["seconds"])
    times = secs[1:]
    rec = {"func": "acc_cli", "times_s": times, "median_s": statistics.median(times), "peak_rss_mib": rss,
           "metrics": {k: metrics[k] for k in KNN_METRICS}}
    print(json.dumps(rec), file=sys.stderr, flush=True)
    return rec


def fmt(s):
    return "–" if s is None else f"{s:.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--func")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--x")
    ap.add_argument("--y")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--sizes", default="20000,120000")
    ap.add_argument("--skip-cbm", action="store_true")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    import numpy as np

    me = [sys.executable, os.path.abspath(__file__), "--worker", "--reps", str(a.reps), "--backend", a.backend]
    print("| case | implementation | median s | × PML default | peak RSS MiB | P@1 | R-prec | MAP@R |")
    print("|---|---|---|---|---|---|---|---|")
    tmp = tempfile.mkdtemp()
    for n in map(int, a.sizes.split(",")):
        x, y = acc_data(n)
        xp, yp = os.path.join(tmp, f"x{n}.npy"), os.path.join(tmp, f"y{n}.npy")
        np.save(xp, x)
        np.save(yp, y)
        args = ["--n", str(n), "--x", xp, "--y", yp]
        recs = [("PML AccuracyCalculator, default Faiss kNN", run(me + ["--func", "acc_pml_faiss"] + args)),
                ("PML AccuracyCalculator, knn_func=KNN()", run(me + ["--func", "acc_pml_knn"] + args)),
                ("wgpu_metric_learning.accuracy", run(me + ["--func", "acc_wml"] + args)),
                ("wml accuracy (CLI, its own seconds)", cli(xp, yp, a.reps))]
        base = recs[0][1]["median_s"]
        for name, r in recs:
            m = r.get("metrics", {})
            ratio = f"{base / r['median_s']:.2f}" if base and r["median_s"] else "–"
            print(f"| accuracy {n:,} × {D}, {CLASSES} classes, k = max_bin_count | {name} | {fmt(r['median_s'])} | "
                  f"{ratio} | {r.get('peak_rss_mib', '–')} | {m.get('precision_at_1', 0):.4f} | "
                  f"{m.get('r_precision', 0):.4f} | {m.get('mean_average_precision_at_r', 0):.4f} |", flush=True)
        wml_s, cli_s = recs[2][1]["median_s"], recs[3][1]["median_s"]
        if wml_s and cli_s:
            print(f"\nPython overhead at {n:,}: wgpu_metric_learning.accuracy {wml_s:.3f} s vs the CLI's own "
                  f"{cli_s:.3f} s: {100 * (wml_s / cli_s - 1):+.1f} %\n", flush=True)
    if a.skip_cbm:
        return
    print("| CrossBatchMemory, batch 128, memory 4 096, 10 classes, TripletMarginMiner | implementation "
          "| median s per step | peak RSS MiB | note |")
    print("|---|---|---|---|---|")
    for kind in ("all", "hard"):
        for impl, name in (("pml", "PML"), ("ours", "wgpu_metric_learning.pml")):
            r = run(me + ["--func", f"cbm_{impl}_{kind}"])
            print(f"| type_of_triplets={kind} | {name} | {fmt(r['median_s'])} | {r.get('peak_rss_mib', '–')} | "
                  f"{r.get('failed', 'ok')} |", flush=True)


if __name__ == "__main__":
    main()
