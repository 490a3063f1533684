#!/usr/bin/env python3
"""sentence-transformers' `MatryoshkaLoss(CachedMultipleNegativesRankingLoss(...))` against the
drop-ins of `wgpu_metric_learning.sentence_transformers`, on one small model built here (no
download: mean token embeddings, then two layers to 768 dimensions), in one run on one
machine: each case in its own process under `flock /tmp/bench.lock`, so that its peak RSS is
its own.

A step is `loss(features).backward()` on a batch of `--batch` (anchor, positive) pairs,
mini-batches of `--mini-batch`, widths 768, 512, 256, 128 and 64. Reported per case, medians
over `--reps` steps after one warm-up:

- `step_s`: the whole step;
- `loss_s`: the loss stage alone (the cached loss's `calculate_loss`: similarities, loss and
  the embeddings' gradients, every width), timed inside the step;
- `model_s`: the rest (both embedding passes through the model, and its backward), which is
  the same work for both and is reported apart;
- `peak_rss_mib`: the process's peak resident memory, and `loss_rss_mib`, its growth during
  the loss stage of the first step.

Also the loss stage of plain `CachedMultipleNegativesRankingLoss` (one width), for the cost of
the widths. Needs the venv of python/requirements-test.txt with the package installed:

    ~/.cache/wml-py-venv/bin/python benches/compare_sentence_transformers.py --reps 3

Prints a Markdown table; raw JSON lines go to stderr.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

DIMS = [768, 512, 256, 128, 64]
CASES = ["st_matryoshka", "wml_matryoshka", "st_cached", "wml_cached"]


def rss_now_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(a):
    import torch  # noqa: F401 - before the library enumerates adapters (Mesa's LLVM vs triton's)
    import torch._dynamo  # noqa: F401
    from torch import nn
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses as st_losses

    from wgpu_metric_learning import sentence_transformers as wst

    torch.set_num_threads(os.cpu_count() or 1)

    class Tiny(nn.Module):
        def __init__(self, vocab=30000, hidden=384, width=768):
            super().__init__()
            self.emb = nn.EmbeddingBag(vocab, hidden, mode="mean")
            self.l1 = nn.Linear(hidden, hidden)
            self.l2 = nn.Linear(hidden, width)
            self.width = width

        def forward(self, features):
            x = torch.tanh(self.l1(self.emb(features["input_ids"])))
            features["sentence_embedding"] = self.l2(x)
            return features

        def get_embedding_dimension(self):
            return self.width

    torch.manual_seed(0)
    model = SentenceTransformer(modules=[Tiny()], device="cpu")
    g = torch.Generator().manual_seed(1)
    feats = [
        {
            "input_ids": torch.randint(0, 30000, (a.batch, 32), generator=g),
            "attention_mask": torch.ones(a.batch, 32, dtype=torch.long),
        }
        for _ in range(2)
    ]
    ns = st_losses if a.case.startswith("st_") else wst
    ours = {} if ns is st_losses else {"backend": a.backend}
    loss = ns.CachedMultipleNegativesRankingLoss(model, mini_batch_size=a.mini_batch, **ours)
    if a.case.endswith("matryoshka"):
        loss_fn = ns.MatryoshkaLoss(model, loss, DIMS)
    else:
        loss_fn = loss
    # Time the loss stage where it runs: sentence-transformers' per-width decorator sits on
    # the instance, the drop-in's method on the class.
    stage = loss.calculate_loss
    timed = {"s": 0.0, "rss": None}

    def timed_stage(*args, **kwargs):
        before = rss_now_mib()
        t0 = time.perf_counter()
        out = stage(*args, **kwargs)
        timed["s"] += time.perf_counter() - t0
        if timed["rss"] is None:
            timed["rss"] = rss_now_mib() - before
        return out

    loss.calculate_loss = timed_stage
    steps, stages, value = [], [], None
    for rep in range(a.reps + 1):
        model.zero_grad()
        timed["s"] = 0.0
        t0 = time.perf_counter()
        v = loss_fn([dict(f) for f in feats], None)
        v.backward()
        elapsed = time.perf_counter() - t0
        value = v.item()
        if rep > 0:
            steps.append(elapsed)
            stages.append(timed["s"])
    grad = model[0].l2.weight.grad
    rec = {
        "case": a.case,
        "batch": a.batch,
        "mini_batch": a.mini_batch,
        "loss": value,
        "grad_l2_norm": float(grad.norm()),
        "step_s": statistics.median(steps),
        "loss_s": statistics.median(stages),
        "model_s": statistics.median(s - t for s, t in zip(steps, stages)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "loss_rss_mib": timed["rss"],
    }
    print("RESULT " + json.dumps(rec), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--mini-batch", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--case", choices=CASES)
    p.add_argument("--backend", default="cpu",
                   help="the drop-ins' backend (default cpu: `auto` would first load every "
                   "adapter's driver, Mesa's software ones included, before picking one)")
    p.add_argument("--worker", action="store_true")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    rows = {}
    for case in CASES:
        cmd = ["flock", "/tmp/bench.lock", sys.executable, __file__, "--worker", "--case", case,
               "--batch", str(a.batch), "--mini-batch", str(a.mini_batch), "--reps", str(a.reps),
               "--backend", a.backend]
        out = subprocess.run(cmd, capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if not lines:
            print(f"{case} failed: {out.stderr[-600:]}", file=sys.stderr)
            continue
        rows[case] = json.loads(lines[-1][7:])
        print(json.dumps(rows[case]), file=sys.stderr, flush=True)
    print(f"batch {a.batch}, mini-batch {a.mini_batch}, widths {DIMS}, median of {a.reps}, "
          f"drop-ins on backend {a.backend!r}\n")
    print("| case | loss | step s | loss stage s | model s | peak RSS MiB | loss-stage RSS growth MiB |")
    print("|---|---|---|---|---|---|---|")
    for case, r in rows.items():
        print(f"| {case} | {r['loss']:.6f} | {r['step_s']:.3f} | {r['loss_s']:.3f} | "
              f"{r['model_s']:.3f} | {r['peak_rss_mib']:.0f} | {r['loss_rss_mib']:.0f} |")
    for kind in ("matryoshka", "cached"):
        st, wml = rows.get(f"st_{kind}"), rows.get(f"wml_{kind}")
        if st and wml:
            print(f"\n{kind}: loss stage {st['loss_s'] / wml['loss_s']:.2f}x faster, "
                  f"step {st['step_s'] / wml['step_s']:.2f}x, peak RSS "
                  f"{wml['peak_rss_mib']:.0f} vs {st['peak_rss_mib']:.0f} MiB, loss "
                  f"{abs(st['loss'] - wml['loss']) / abs(st['loss']):.1e} relative apart")
    if "wml_matryoshka" in rows and "wml_cached" in rows:
        r = rows["wml_matryoshka"]["loss_s"] / rows["wml_cached"]["loss_s"]
        print(f"\nthe library's five widths cost {r:.2f}x its one width (loss stage)")


if __name__ == "__main__":
    main()
