#!/usr/bin/env python3
"""Side-by-side memory-bank benchmark: this library's MemoryBank (lavapipe and native CPU paths)
against pytorch-metric-learning's CrossBatchMemory, in one run on one machine, every timed
process under `flock /tmp/bench.lock`.

Needs the anchors' venv (see ../shared/anchors/README.md); not part of CI.

    cargo build --release --example bench_bank
    ~/.cache/wml-anchor-venv/bin/python benches/compare_bank.py --reps 3 > bench-bank.md

Cases: banks of 4 096 and 65 536 rows x 128, batch 128, 100 and 10 classes. Per case:
enqueue alone (ours: MemoryBank::enqueue; PML: CrossBatchMemory.add_to_memory), and one
training step, enqueue + TripletMarginMiner (all, semihard) against the full bank (ours:
enqueue + mine_triplets, or count_triplets where the arrays would not fit in host memory; PML:
CrossBatchMemory(TripletMarginLoss, miner=TripletMarginMiner) forward via the anchors'
bench_pml.py `cbm_<type>` worker, which also computes the loss). Markdown rows on stdout, raw
JSON lines on stderr.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import result  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")
OURS = os.path.join(ROOT, "target", "release", "examples", "bench_bank")

# PML's enqueue, timed like the anchors time everything (median after a warm-up).
PML_ENQUEUE = r"""
import json, sys, time, statistics, torch
import torch.nn.functional as F
from pytorch_metric_learning import losses
torch.set_num_threads(2)
B, M, C, reps = (int(a) for a in sys.argv[1:5])
g = torch.Generator().manual_seed(0)
cbm = losses.CrossBatchMemory(losses.TripletMarginLoss(margin=0.2), 128, memory_size=M)
cbm.embedding_memory[:] = F.normalize(torch.randn(M, 128, generator=g), dim=1)
cbm.label_memory[:] = torch.randint(0, C, (M,), generator=g)
cbm.has_been_filled = True
batches = [(F.normalize(torch.randn(B, 128, generator=g), dim=1), torch.randint(0, C, (B,), generator=g))
           for _ in range(reps + 1)]
times = []
for i, (e, l) in enumerate(batches):
    t = time.perf_counter()
    cbm.add_to_memory(e, l, B)
    if i > 0:
        times.append(time.perf_counter() - t)
print("RESULT " + json.dumps({"impl": "pml", "func": "enqueue", "B": B, "M": M, "C": C,
                              "median_s": statistics.median(times), "status": "ok"}))
"""


def ours(path, func, B, M, C, reps):
    return result([OURS, "--path", path, "--func", func, "--B", str(B), "--M", str(M), "--C", str(C),
                   "--reps", str(reps)], 1800)


def pml(func, B, M, C, reps, timeout):
    if func == "enqueue":
        return result([sys.executable, "-c", PML_ENQUEUE, str(B), str(M), str(C), str(reps)], timeout)
    return result([sys.executable, os.path.join(ANCHORS, "bench_pml.py"), "--worker", "--func", func,
                   "--B", str(B), "--M", str(M), "--C", str(C), "--reps", str(reps)], timeout)


def secs(rec):
    if rec.get("status", "ok") != "ok":
        return None
    if rec.get("func") == "enqueue" and "enqueue_median_s" in rec:
        return rec["enqueue_median_s"]
    return rec.get("median_s", rec.get("median"))


def fmt_s(rec):
    s = secs(rec)
    if s is None:
        err = rec.get("error") or rec.get("status") or "failed"
        return "fails: " + str(err)[:60].replace("|", "/")
    return f"{s * 1e6:.0f} µs" if s < 0.01 else f"{s:.3f}"


def ratio(pml_rec, our_rec):
    a, b = secs(pml_rec), secs(our_rec)
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.1f}"


def count(rec):
    c = rec.get("count")
    return f"{c:,}" if isinstance(c, int) else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--classes", default="100,10")
    ap.add_argument("--memories", default="4096,65536")
    ap.add_argument("--pml-timeout", type=int, default=600)
    ap.add_argument("--big-classes", default="100",
                    help="class counts for which banks over 4096 rows run (10 classes x 65 536 rows "
                         "counts 5e10 triplets per step: minutes on lavapipe)")
    a = ap.parse_args()
    B = 128
    print("| C | M | step | PML s | PML peak RSS MB | ours lavapipe s | x | ours native s | x | count (ours) | peak device MiB (lavapipe) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for C in (int(c) for c in a.classes.split(",")):
        for M in (int(m) for m in a.memories.split(",")):
            if M > 4096 and str(C) not in a.big_classes.split(","):
                continue
            for step in ("enqueue", "all", "semihard"):
                if step == "enqueue":
                    ours_func, pml_func = "enqueue", "enqueue"
                else:
                    # Arrays of every triplet of the 65 536-row bank would take 30-65 GB.
                    suffix = "_count" if M > 4096 else ""
                    ours_func, pml_func = f"cbm_{step}{suffix}", f"cbm_{step}"
                p = pml(pml_func, B, M, C, a.reps, a.pml_timeout)
                w = ours("wgpu", ours_func, B, M, C, a.reps)
                n = ours("cpu", ours_func, B, M, C, a.reps)
                label = "enqueue" if step == "enqueue" else f"enqueue + {step}{' (count)' if M > 4096 else ''}"
                print(f"| {C} | {M} | {label} | {fmt_s(p)} | {p.get('peak_rss_mb', '-')} | {fmt_s(w)} | {ratio(p, w)} "
                      f"| {fmt_s(n)} | {ratio(p, n)} | {count(w)} | {w.get('peak_device_mib', '-')} |", flush=True)


if __name__ == "__main__":
    main()
