#!/usr/bin/env python3
"""Side-by-side triplet-mining benchmark: this library (lavapipe and native CPU paths) against
pytorch-metric-learning, in one run on one machine, every timed process under
`flock /tmp/bench.lock`.

Needs the anchors' venv (see ../shared/anchors/README.md); not part of CI.

    cargo build --release --example bench_mining
    ~/.cache/wml-anchor-venv/bin/python benches/compare_pml.py --reps 3 > bench-mining.md

Each case prints a markdown row as soon as it is measured; raw JSON lines go to stderr.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import result, secs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")
OURS = os.path.join(ROOT, "target", "release", "examples", "bench_mining")
SCENARIOS = [(21, 10000), (512, 2000), (1000, 1000), (128, 4096)]
FUNCS = ["lmu", "miner_all", "miner_hard", "miner_semihard", "miner_easy"]


def ours(path, func, B, M, C, reps, budget):
    return result([OURS, "--path", path, "--func", func, "--B", str(B), "--M", str(M), "--C", str(C),
                   "--reps", str(reps), "--budget-mib", str(budget)], 1800)


def pml(func, B, M, C, reps):
    return result([sys.executable, os.path.join(ANCHORS, "bench_pml.py"), "--worker", "--func", func,
                   "--B", str(B), "--M", str(M), "--C", str(C), "--reps", str(reps)], 2400)


def speedup(pml_secs, rec):
    """PML's time over ours, or "–" when either is missing."""
    s = secs(rec)
    return f"{pml_secs / s:.1f}" if (pml_secs and s) else "–"


def fmt(rec):
    s = secs(rec)
    return f"{s:.3f}" if s is not None else rec.get("status", "?")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-mib", type=int, default=64)
    ap.add_argument("--classes", default="100,10")
    ap.add_argument("--scenarios", default="")
    ap.add_argument("--funcs", default=",".join(FUNCS))
    ap.add_argument("--native", action="store_true",
                    help="the native CPU path only (issue 6's table): arrays, count-only and streamed")
    a = ap.parse_args()
    scen = SCENARIOS if not a.scenarios else [tuple(map(int, s.split("x"))) for s in a.scenarios.split(",")]
    if a.native:
        native_table(a, scen)
        return
    print("| C | B | M | function | PML s | PML peak RSS MiB | triplets (PML) | ours lavapipe s | × PML | ours native s | × PML | triplets (ours) | peak device MiB (budget) | lavapipe count-only s | × PML | lavapipe streamed s (peak RSS MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for C in [int(c) for c in a.classes.split(",")]:
        for (B, M) in scen:
            for func in a.funcs.split(","):
                p = pml(func, B, M, C, a.reps)
                g = ours("wgpu", func, B, M, C, a.reps, a.budget_mib)
                n = ours("cpu", func, B, M, C, a.reps, a.budget_mib)
                gc = ours("wgpu", func + "_count", B, M, C, a.reps, a.budget_mib)
                gs = ours("wgpu", func + "_stream", B, M, C, a.reps, a.budget_mib)
                ps = secs(p) if p.get("status", "ok") == "ok" else None
                ratio = lambda rec: speedup(ps, rec)  # noqa: E731

                print(f"| {C} | {B} | {M} | {func} | {fmt(p)} | {p.get('peak_rss_mb', '–')} | {p.get('count', '–'):,} | "
                      f"{fmt(g)} | {ratio(g)} | {fmt(n)} | {ratio(n)} | {g.get('count', '–'):,} | "
                      f"{g.get('peak_device_mib', '–')} ({g.get('budget_mib', '–')}) | {fmt(gc)} | {ratio(gc)} | "
                      f"{fmt(gs)} ({gs.get('peak_rss_mb', '–')}) |", flush=True)


def native_table(a, scen):
    print("| C | B | M | function | PML s | PML peak RSS MiB | ours native s | × PML | native peak RSS MiB | triplets (ours) | native count-only s | × PML | native streamed s (peak RSS MiB) | × PML |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for C in [int(c) for c in a.classes.split(",")]:
        for (B, M) in scen:
            for func in a.funcs.split(","):
                p = pml(func, B, M, C, a.reps)
                n = ours("cpu", func, B, M, C, a.reps, a.budget_mib)
                nc = ours("cpu", func + "_count", B, M, C, a.reps, a.budget_mib)
                ns = ours("cpu", func + "_stream", B, M, C, a.reps, a.budget_mib)
                ps = secs(p) if p.get("status", "ok") == "ok" else None
                ratio = lambda rec: speedup(ps, rec)  # noqa: E731

                print(f"| {C} | {B} | {M} | {func} | {fmt(p)} | {p.get('peak_rss_mb', '–')} | {fmt(n)} | {ratio(n)} | "
                      f"{n.get('peak_rss_mb', '–')} | {n.get('count', '–'):,} | {fmt(nc)} | {ratio(nc)} | "
                      f"{fmt(ns)} ({ns.get('peak_rss_mb', '–')}) | {ratio(ns)} |", flush=True)


if __name__ == "__main__":
    main()
