#!/usr/bin/env python3
"""PML's losses with class weights (ArcFace and its family) side by side with the drop-ins of
`wgpu_metric_learning.pml`, forward and backward (embeddings and weights), on identical arrays
in one run: B = 512, D = 512, C = 100 000 by default (`--shape B D C`), one worker process per
case and implementation (so its peak RSS is its own), PML and the library alternating. Values
and gradients are compared (the largest gradient difference relative to the largest gradient).

Needs the Python venv of python/requirements-test.txt with the package installed (README);
not part of CI:

    ~/.cache/wml-py-venv/bin/python benches/compare_classifier_losses.py --reps 3

`--only ArcFaceLoss ...` picks losses. Raw JSON lines go to stderr.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

LOSSES = {
    "ArcFaceLoss": {},
    "CosFaceLoss": {},
    "NormalizedSoftmaxLoss": {},
    "ProxyNCALoss": {},
    "ProxyAnchorLoss": {},
    "LargeMarginSoftmaxLoss": {},
    "SphereFaceLoss": {},
    # C classes of 3 (10) centres each: the weights hold 3 (10) times the columns.
    "SubCenterArcFaceLoss": {"sub_centers": 3},
    "SoftTripleLoss": {"centers_per_class": 10},
}
WEIGHTS = {"ProxyNCALoss": "proxies", "ProxyAnchorLoss": "proxies", "SoftTripleLoss": "fc"}


def worker(impl, name, b, d, c, reps, out_dir):
    import numpy as np
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if impl == "pml":
        from pytorch_metric_learning import losses as mod
        extra = {}
    else:
        from wgpu_metric_learning import pml as mod
        extra = {"backend": "cpu"}
    classes = c // 10 if name == "SoftTripleLoss" else c
    kw = dict(LOSSES[name], num_classes=classes, embedding_size=d, **extra)
    torch.manual_seed(0)
    loss = getattr(mod, name)(**kw)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(b, d, generator=g)
    labels = torch.randint(0, classes, (b,), generator=g)
    attr = WEIGHTS.get(name, "W")
    times = []
    for _ in range(reps + 1):
        x = x0.clone().requires_grad_(True)
        getattr(loss, attr).grad = None
        start = time.perf_counter()
        value = loss(x, labels)
        value.backward()
        times.append(time.perf_counter() - start)
    w_grad = getattr(loss, attr).grad
    np.save(os.path.join(out_dir, f"{impl}-{name}-x.npy"), x.grad.numpy())
    np.save(os.path.join(out_dir, f"{impl}-{name}-w.npy"), w_grad.numpy())
    return {
        "impl": impl,
        "loss": name,
        "value": value.item(),
        "seconds": statistics.median(times[1:]),
        "peak_rss_mib": peak_rss_mib(),
    }


def peak_rss_mib():
    """The worker's own peak RSS: VmHWM (ru_maxrss keeps the forking parent's across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def spawn(impl, name, args, out_dir):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, name, "--reps", str(args.reps),
           "--shape", *map(str, args.shape), "--out", out_dir]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["killed"]
        return {"impl": impl, "loss": name, "error": f"rc {run.returncode}: {tail[0]}"}
    return json.loads(run.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--shape", type=int, nargs=3, default=[512, 512, 100_000])
    p.add_argument("--only", nargs="*")
    p.add_argument("--worker", nargs=2)
    p.add_argument("--out")
    args = p.parse_args()
    b, d, c = args.shape
    if args.worker:
        print(json.dumps(worker(*args.worker, b, d, c, args.reps, args.out)))
        return
    import tempfile

    import numpy as np

    names = args.only or list(LOSSES)
    print(f"B = {b}, D = {d}, C = {c} (SoftTriple: C / 10 classes of 10 centres), forward + "
          f"backward, median of {args.reps} after a warm-up, {os.cpu_count()} threads\n")
    print("| loss | PML s | ours s | speed-up | PML peak RSS MiB | ours MiB | value rel. diff | "
          "grad diff (x, W) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as out_dir:
        for name in names:
            theirs = spawn("pml", name, args, out_dir)
            ours = spawn("ours", name, args, out_dir)
            print(json.dumps(theirs), file=sys.stderr)
            print(json.dumps(ours), file=sys.stderr)
            if "error" in theirs or "error" in ours:
                print(f"| {name} | {theirs.get('seconds', theirs.get('error'))} | "
                      f"{ours.get('seconds', ours.get('error'))} | | | | | |")
                continue
            diffs = []
            for part in ("x", "w"):
                a = np.load(os.path.join(out_dir, f"ours-{name}-{part}.npy")).astype(np.float64)
                t = np.load(os.path.join(out_dir, f"pml-{name}-{part}.npy")).astype(np.float64)
                diffs.append(np.abs(a - t).max() / max(np.abs(t).max(), 1e-30))
                del a, t
            rel = abs(ours["value"] - theirs["value"]) / max(abs(theirs["value"]), 1e-30)
            print(f"| {name} | {theirs['seconds']:.3f} | {ours['seconds']:.3f} | "
                  f"{theirs['seconds'] / ours['seconds']:.2f}× | {theirs['peak_rss_mib']:.0f} | "
                  f"{ours['peak_rss_mib']:.0f} | {rel:.1e} | {diffs[0]:.1e}, {diffs[1]:.1e} |")


if __name__ == "__main__":
    main()
