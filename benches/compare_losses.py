#!/usr/bin/env python3
"""The losses with their gradients side by side with PML and torch, on identical arrays, in one
run on one machine (every timed process under `flock /tmp/bench.lock`, one worker process per
case so that its peak RSS is that case's own):

- PML's `TripletMarginLoss` over every valid triplet of a batch of 128 (10 classes, d = 128)
  against 4 096 and 65 536 reference rows (a memory bank's: detached), forward and backward,
  against `wgpu_metric_learning.pml.TripletMarginLoss` (the library's run sums, no triplet
  list).
- The same loss with PML's `swap=True` over a batch against itself (512 rows, 10 classes:
  ~1.2·10⁷ triplets; PML's swap is only right without references), against the library's
  per-triplet evaluation, and the library without swap for its cost.
- NTXent (two views of 2 048 items: B = 4 096, d = 768, temperature 0.07) and
  sentence-transformers' MultipleNegativesRankingLoss (4 096 anchors against their 4 096
  positives, scale 20) in torch's full-matrix form (what PML's and sentence-transformers'
  code compute, without PML's pair masks) against the library's block version; values and
  gradients compared.

- PML's pair losses (`--pair [M ...]`: ContrastiveLoss, MultiSimilarityLoss, SupConLoss,
  CircleLoss, NCALoss, GeneralizedLiftedStructureLoss, MarginLoss, LiftedStructureLoss,
  TupletMarginLoss, IntraPairVarianceLoss, AngularLoss, PML's defaults) of a batch of 256 (10 classes,
  d = 128) against M detached reference rows (default 4 096), forward and backward, PML
  against the drop-ins; `--in-batch [B ...]` the losses whose PML code refuses references
  (FastAPLoss, HistogramLoss, RankedListLoss with margin 0.4 and Tn 1,
  ThresholdConsistentMarginLoss, PNPLoss, NPairsLoss, InstanceLoss) on a batch of B;
  `--vicreg [NxD ...]` PML's VICRegLoss of two views (n, d), forward and backward; `--only NAME ...` picks losses.

Needs the Python venv of python/requirements-test.txt with the package installed (README);
not part of CI:

    ~/.cache/wml-py-venv/bin/python benches/compare_losses.py --reps 3 > bench-losses.md

Raw JSON lines go to stderr.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def triplet_data(m, b=128, d=128, classes=10, seed=3):
    import torch

    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, d, generator=g)
    y = torch.randint(0, classes, (b,), generator=g)
    ry = torch.randint(0, classes, (m,), generator=g)
    x = centers[y] + 2.0 * torch.randn(b, d, generator=g)
    r = centers[ry] + 2.0 * torch.randn(m, d, generator=g)
    return x, y, r, ry


def pair_data(b=4096, d=768, seed=4):
    import torch

    g = torch.Generator().manual_seed(seed)
    # Views and positives noisy enough that the losses are O(1), where f32 keeps their digits
    # (near 0, log-softmax in f32 loses them: 1e-4 of error on a loss of 1e-4).
    items = torch.randn(b // 2, d, generator=g)
    x = torch.cat([items + 1.5 * torch.randn(b // 2, d, generator=g) for _ in range(2)])
    labels = torch.arange(b // 2).repeat(2)
    anchors = torch.randn(b, d, generator=g)
    positives = anchors + 1.5 * torch.randn(b, d, generator=g)
    return x, labels, anchors, positives


def ntxent_torch(x, labels, temperature):
    """NTXent as one (B, B) matrix: each positive pair against its anchor's negatives."""
    import torch

    s = torch.nn.functional.normalize(x, dim=1)
    s = s @ s.T / temperature
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(x), dtype=torch.bool)
    neg = torch.where(same, torch.full_like(s, float("-inf")), s)
    neg_lse = torch.logsumexp(neg, dim=1, keepdim=True)
    pos = same & ~eye
    a, p = pos.nonzero(as_tuple=True)
    sp = s[a, p]
    return (torch.logaddexp(sp, neg_lse[a, 0]) - sp).mean()


def mnrl_torch(anchors, positives, scale):
    import torch

    scores = torch.nn.functional.normalize(anchors, dim=1) @ torch.nn.functional.normalize(positives, dim=1).T
    return torch.nn.functional.cross_entropy(scores * scale, torch.arange(len(anchors)))


# PML's pair losses the drop-ins compute (`--pair`), with PML's defaults.
PAIR_LOSSES = ("ContrastiveLoss", "MultiSimilarityLoss", "SupConLoss", "CircleLoss", "NCALoss",
               "GeneralizedLiftedStructureLoss", "MarginLoss", "LiftedStructureLoss",
               "TupletMarginLoss", "IntraPairVarianceLoss", "AngularLoss",
               "SignalToNoiseRatioContrastiveLoss", "DynamicSoftMarginLoss")
# The losses whose PML code refuses references (`--in-batch`): B rows, no references.
IN_BATCH_LOSSES = ("FastAPLoss", "HistogramLoss", "RankedListLoss", "ThresholdConsistentMarginLoss",
                   "PNPLoss", "NPairsLoss", "InstanceLoss")
# Parameters PML requires (no default).
REQUIRED = {"RankedListLoss": dict(margin=0.4, Tn=1.0)}


def worker(a):
    import torch

    torch.set_num_threads(2)
    rec = {"func": a.func, "m": a.m}
    if a.func.startswith("swap_"):
        from pytorch_metric_learning import losses

        x, y, _, _ = triplet_data(0, b=a.m)
        if a.func == "swap_pml":
            loss_fn = losses.TripletMarginLoss(margin=0.05, swap=True)
        else:
            from wgpu_metric_learning import pml as drop

            loss_fn = drop.TripletMarginLoss(
                margin=0.05, swap=a.func == "swap_ours", backend=a.backend
            )
            rec["path"] = loss_fn.context.path
        timings = []
        for _ in range(a.reps):
            e = x.clone().requires_grad_(True)
            t = time.perf_counter()
            loss = loss_fn(e, y)
            loss.backward()
            timings.append(time.perf_counter() - t)
        rec.update(loss=loss.item(), seconds=timings)
        torch.save(e.grad, f"/tmp/wml-loss-grad-{a.func}-{a.m}.pt")
    elif a.func.startswith(("pair_", "inbatch_")):
        from pytorch_metric_learning import losses

        kind, name, side = a.func.split("_")
        if kind == "pair":
            x, y, r, ry = triplet_data(a.m, b=256)
        else:
            x, y, _, _ = triplet_data(0, b=a.m)
        kw = REQUIRED.get(name, {})
        if side == "pml":
            loss_fn = getattr(losses, name)(**kw)
        else:
            from wgpu_metric_learning import pml as drop

            loss_fn = getattr(drop, name)(backend=a.backend, **kw)
            rec["path"] = loss_fn.context.path
        timings = []
        for _ in range(a.reps):
            e = x.clone().requires_grad_(True)
            t = time.perf_counter()
            loss = loss_fn(e, y, None, r, ry) if kind == "pair" else loss_fn(e, y)
            loss.backward()
            timings.append(time.perf_counter() - t)
            if name == "DynamicSoftMarginLoss" and side == "pml":
                # PML's hist_ keeps the step's graph and its next backward raises.
                loss_fn.hist_ = loss_fn.hist_.detach()
        rec.update(loss=loss.item(), seconds=timings)
        torch.save(e.grad, f"/tmp/wml-loss-grad-{a.func}-{a.m}.pt")
    elif a.func.startswith("vicreg_"):
        from pytorch_metric_learning import losses

        g = torch.Generator().manual_seed(5)
        z = torch.randn(a.m, a.d, generator=g)
        z2 = z + 0.1 * torch.randn(a.m, a.d, generator=g)
        if a.func == "vicreg_pml":
            loss_fn = losses.VICRegLoss()
        else:
            from wgpu_metric_learning import pml as drop

            loss_fn = drop.VICRegLoss(backend=a.backend)
        timings = []
        for _ in range(a.reps):
            e, e2 = z.clone().requires_grad_(True), z2.clone().requires_grad_(True)
            t = time.perf_counter()
            loss = loss_fn(e, ref_emb=e2)
            loss.backward()
            timings.append(time.perf_counter() - t)
        rec.update(loss=loss.item(), seconds=timings)
        torch.save(e.grad, f"/tmp/wml-loss-grad-{a.func}-{a.m}.pt")
    elif a.func.startswith("triplet_"):
        from pytorch_metric_learning import losses

        x, y, r, ry = triplet_data(a.m)
        if a.func == "triplet_pml":
            loss_fn = losses.TripletMarginLoss(margin=0.05)
        else:
            from wgpu_metric_learning import pml as drop

            loss_fn = drop.TripletMarginLoss(margin=0.05, backend=a.backend)
            rec["path"] = loss_fn.context.path

        def run():
            e = x.clone().requires_grad_(True)
            loss = loss_fn(e, y, None, r, ry)
            loss.backward()
            return loss.item(), e.grad

        timings = []
        for _ in range(a.reps):
            t = time.perf_counter()
            value, grad = run()
            timings.append(time.perf_counter() - t)
        rec.update(loss=value, grad_norm=float(grad.norm()), seconds=timings)
        torch.save(grad, f"/tmp/wml-loss-grad-{a.func}-{a.m}.pt")
    else:
        x, labels, anchors, positives = pair_data()
        if a.func == "ntxent_torch":
            inputs = (x,)
            fn = lambda e: ntxent_torch(e, labels, 0.07)  # noqa: E731
        elif a.func == "ntxent_ours":
            from wgpu_metric_learning import pml as drop

            loss_fn = drop.NTXentLoss(temperature=0.07, backend=a.backend)
            rec["path"] = loss_fn.context.path
            inputs = (x,)
            fn = lambda e: loss_fn(e, labels)  # noqa: E731
        elif a.func == "mnrl_torch":
            inputs = (anchors, positives)
            fn = lambda q, d: mnrl_torch(q, d, 20.0)  # noqa: E731
        else:
            from wgpu_metric_learning import pml as drop

            loss_fn = drop.MultipleNegativesRankingLoss(scale=20.0, backend=a.backend)
            rec["path"] = loss_fn.context.path
            inputs = (anchors, positives)
            fn = loss_fn
        timings = []
        for _ in range(a.reps):
            leaves = [t.clone().requires_grad_(True) for t in inputs]
            t0 = time.perf_counter()
            loss = fn(*leaves)
            loss.backward()
            timings.append(time.perf_counter() - t0)
        rec.update(loss=loss.item(), seconds=timings)
        if a.func.endswith("_torch"):
            # The same loss in float64: the yardstick for both float32 values.
            exact = {"ntxent_torch": lambda e: ntxent_torch(e, labels, 0.07),
                     "mnrl_torch": lambda q, d: mnrl_torch(q, d, 20.0)}[a.func]
            rec["loss_f64"] = exact(*[t.double() for t in inputs]).item()
        torch.save([t.grad for t in leaves], f"/tmp/wml-loss-grad-{a.func}.pt")
    rec["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(rec))


def launch(func, m, reps, backend, d=0):
    cmd = ["flock", "/tmp/bench.lock", sys.executable, __file__, "--worker", func,
           "--m", str(m), "--d", str(d), "--reps", str(reps), "--backend", backend]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"func": func, "m": m, "failed": p.returncode, "stderr": p.stderr[-400:]}
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps(rec), file=sys.stderr)
    return rec


def print_row(case, name, rec):
    """One implementation's row of the table: median seconds, peak RSS, loss (or its failure)."""
    if "failed" in rec:
        print(f"| {case} | {name} | failed (exit {rec['failed']}) | | |")
        return
    print(f"| {case} | {name} | {statistics.median(rec['seconds']):.3f} | "
          f"{rec['peak_rss_mib']:.0f} | {rec['loss']:.6f} |")


def relative_difference(a, b):
    import torch

    pairs = zip(a, b) if isinstance(a, list) else [(a, b)]
    return max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) for x, y in pairs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--m", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--bank", type=int, nargs="*", default=[4096, 65536])
    ap.add_argument("--swap-batch", type=int, default=512, help="0: no swap cases")
    ap.add_argument("--pair", type=int, nargs="*", default=None,
                    help="only PML's pair losses, against these reference counts (default 4096)")
    ap.add_argument("--in-batch", type=int, nargs="*", default=None,
                    help="only PML's losses that refuse references, on batches of these sizes")
    ap.add_argument("--only", nargs="*", default=None, help="these losses only (class names)")
    ap.add_argument("--vicreg", nargs="*", default=None, help="only VICReg, on views NxD")
    ap.add_argument("--d", type=int, default=0)
    a = ap.parse_args()
    if a.worker:
        a.func = a.worker
        return worker(a)
    import torch

    print("| case | implementation | median s | peak RSS MiB | loss |")
    print("|---|---|---|---|---|")
    if a.vicreg is not None:
        for shape in a.vicreg or ["256x2048"]:
            n, d = (int(v) for v in shape.split("x"))
            funcs = ("vicreg_pml", "vicreg_ours")
            recs = {f: launch(f, n, a.reps, a.backend, d) for f in funcs}
            label = f"VICRegLoss, ({n}, {d})"
            for f, rec in recs.items():
                print_row(label, "PML VICRegLoss" if f == "vicreg_pml" else "wml.pml VICRegLoss", rec)
            if all("failed" not in r for r in recs.values()):
                g = [torch.load(f"/tmp/wml-loss-grad-{f}-{n}.pt") for f in funcs]
                t = [statistics.median(recs[f]["seconds"]) for f in funcs]
                print(f"| {label} | speed-up {t[0] / t[1]:.1f}×; gradient max relative "
                      f"difference | {relative_difference(g[1], g[0]):.1e} | | |")
        return
    modes = [("pair", PAIR_LOSSES, a.pair, "256 × {m}"),
             ("inbatch", IN_BATCH_LOSSES, a.in_batch, "B = {m}")]
    if a.pair is not None or a.in_batch is not None:
        for kind, names, sizes, case in modes:
            if sizes is None:
                continue
            for m in sizes or [4096]:
                for name in names:
                    if a.only and name not in a.only:
                        continue
                    funcs = (f"{kind}_{name}_pml", f"{kind}_{name}_ours")
                    recs = {f: launch(f, m, a.reps, a.backend) for f in funcs}
                    label = f"{name}, {case.format(m=m)}"
                    for f, rec in recs.items():
                        who = "PML" if f.endswith("_pml") else "wml.pml"
                        print_row(label, f"{who} {name}", rec)
                    if all("failed" not in r for r in recs.values()):
                        g = [torch.load(f"/tmp/wml-loss-grad-{f}-{m}.pt") for f in funcs]
                        t = [statistics.median(recs[f]["seconds"]) for f in funcs]
                        print(f"| {label} | speed-up {t[0] / t[1]:.1f}×; gradient max "
                              f"relative difference | {relative_difference(g[1], g[0]):.1e} | | |")
        return
    for m in a.bank:
        recs = {f: launch(f, m, a.reps, a.backend) for f in ("triplet_pml", "triplet_ours")}
        for f, rec in recs.items():
            name = "PML TripletMarginLoss" if f == "triplet_pml" else "wml.pml.TripletMarginLoss"
            print_row(f"triplet, 128 × {m}", name, rec)
        if all("failed" not in r for r in recs.values()):
            g = [torch.load(f"/tmp/wml-loss-grad-{f}-{m}.pt") for f in recs]
            print(f"| triplet, 128 × {m} | gradient max relative difference | "
                  f"{relative_difference(g[1], g[0]):.1e} | | |")
    if a.swap_batch:
        b = a.swap_batch
        recs = {f: launch(f, b, a.reps, a.backend) for f in ("swap_pml", "swap_ours", "swap_ours_off")}
        names = {"swap_pml": "PML TripletMarginLoss(swap=True)",
                 "swap_ours": "wml.pml.TripletMarginLoss(swap=True)",
                 "swap_ours_off": "wml.pml.TripletMarginLoss() (no swap)"}
        for f, rec in recs.items():
            print_row(f"triplet swap, {b} in-batch", names[f], rec)
        if all("failed" not in recs[f] for f in ("swap_pml", "swap_ours")):
            g = [torch.load(f"/tmp/wml-loss-grad-{f}-{b}.pt") for f in ("swap_pml", "swap_ours")]
            print(f"| triplet swap, {b} in-batch | gradient max relative difference | "
                  f"{relative_difference(g[1], g[0]):.1e} | | |")
    for family in ("ntxent", "mnrl"):
        recs = {f: launch(f, 0, a.reps, a.backend) for f in (f"{family}_torch", f"{family}_ours")}
        for f, rec in recs.items():
            print_row(f"{family}, B = 4096, d = 768", f, rec)
        if all("failed" not in r for r in recs.values()):
            g = [torch.load(f"/tmp/wml-loss-grad-{f}.pt") for f in recs]
            lt, lo = (recs[f]["loss"] for f in recs)
            exact = recs[f"{family}_torch"]["loss_f64"]
            print(f"| {family} | loss relative difference to torch {abs(lo - lt) / abs(lt):.1e} "
                  f"(to float64: ours {abs(lo - exact) / abs(exact):.1e}, torch's "
                  f"{abs(lt - exact) / abs(exact):.1e}); gradient max relative difference | "
                  f"{relative_difference(g[1], g[0]):.1e} | | |")


if __name__ == "__main__":
    main()
