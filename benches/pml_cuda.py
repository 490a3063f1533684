#!/usr/bin/env python3
"""pytorch-metric-learning on CUDA, for the GPU report's side-by-side ratios.

Times the cases `benches/gpu-report.sh` runs on our side, on the same GPU, with the tensors
already on the device (PML's natural use; our times include the host uploads and readbacks,
so the ratios are conservative for us). Prints one JSON line per case:

  knn_k<k>        CustomKNN(CosineSimilarity(), batch_size=B)(q, k, ref): Q x N x 128, the
                  faster of B = None and 1024 (None holds the whole Q x N matrix)
  miner_<type>    TripletMarginMiner(margin=0.2, type_of_triplets=<type>)(emb, labels, ref,
                  ref_labels), default LpDistance (normalised), labels uniform over C classes
  lmu             lmu.get_all_triplets_indices(labels, ref_labels)
  loss_ntxent, loss_mnrl
                  torch's full-matrix NTXent (two noisy views of B/2 items, temperature 0.07)
                  and MNRL (B anchors against their noisy positives, scale 20), forward and
                  backward, in D dimensions (benches/compare_losses.py's forms)
  gemm            torch's fp32 q @ r.T (cuBLAS, TF32 off) of Q x D by N x D: the GEMM reference
  loss_pair_<name>
                  PML's pair loss <name> (bench_mining's names) with its defaults, forward and
                  backward: B normalised queries against M references, or among themselves
                  (M = 0); labels uniform over C classes
  classifier_<kind>
                  PML's ArcFaceLoss, CosFaceLoss, NormalizedSoftmaxLoss or ProxyNCALoss
                  (num_classes=C, embedding_size=D) with its defaults, forward and backward
                  (the embeddings' and the weights' gradients): B random rows, labels uniform
  loss_triplet_<type>
                  TripletMarginLoss()(emb, labels, miner(...), ref, ref_labels).backward() with
                  emb requiring grad: every valid triplet (type all) or TripletMarginMiner(0.2,
                  type)'s; the loss's own memory (B x M x M masks) is what limits it

Usage: pml_cuda.py --Q 10000 --N 100000 --mining 128,4096,100,semihard 1000,1000,100,hard
Exits 0 with a note on stderr when torch, CUDA or PML is missing (the report then has no
ratios).
"""
import argparse
import json
import statistics
import sys
import time


def timed(fn, reps):
    """Median seconds of `reps` calls after one warm-up, synchronising the device around each."""
    import torch

    out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--Q", type=int, default=10_000)
    p.add_argument("--N", type=int, default=100_000)
    p.add_argument("--k", default="10,100")
    p.add_argument("--mining", nargs="*", default=[], help="B,M,C,type (type: all|hard|semihard|easy|lmu)")
    p.add_argument("--loss", nargs="*", default=[],
                   help="B,M,C,type: TripletMarginLoss with its backward (type: all|hard|semihard)")
    p.add_argument("--infonce", nargs="*", default=[],
                   help="B,D: NTXent and MNRL in torch's full-matrix form with their backward")
    p.add_argument("--gemm", nargs="*", default=[],
                   help="Q,N,D: torch's fp32 q @ r.T on CUDA (cuBLAS, TF32 off), the GEMM reference")
    p.add_argument("--pair", nargs="*", default=[],
                   help="name,B,M,C: PML's pair loss with its backward (M = 0: in-batch)")
    p.add_argument("--classifier", nargs="*", default=[],
                   help="kind,B,D,C: PML's loss with class weights with its backward")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    try:
        import torch
        from pytorch_metric_learning import miners
        from pytorch_metric_learning.distances import CosineSimilarity
        from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
        from pytorch_metric_learning.utils.inference import CustomKNN
    except ImportError as e:
        print(f"pml_cuda: no PML comparison ({e})", file=sys.stderr)
        return
    if not torch.cuda.is_available():
        print("pml_cuda: no PML comparison (torch sees no CUDA device)", file=sys.stderr)
        return
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    g = torch.Generator(device=dev).manual_seed(0)
    # Plain fp32 products: no TF32 (our kernels are fp32 FMA).
    torch.backends.cuda.matmul.allow_tf32 = False
    for case in a.gemm:
        gq, gn, gd = (int(v) for v in case.split(","))
        x = torch.randn(gq, gd, device=dev, generator=g)
        y = torch.randn(gn, gd, device=dev, generator=g)
        secs, _ = timed(lambda: x @ y.T, a.reps)
        print(json.dumps({"impl": "torch-cuda", "device": name, "func": "gemm", "Q": gq, "N": gn, "D": gd,
                          "median_s": secs, "tflops": 2 * gq * gn * gd / secs / 1e12}), flush=True)
    d = 128
    q = torch.nn.functional.normalize(torch.randn(a.Q, d, device=dev, generator=g), dim=1)
    ref = torch.nn.functional.normalize(torch.randn(a.N, d, device=dev, generator=g), dim=1)
    for k in (int(s) for s in a.k.split(",") if s):
        best = None
        for batch in (None, 1024):
            knn = CustomKNN(CosineSimilarity(), batch_size=batch)
            try:
                secs, _ = timed(lambda: knn(q, k, ref), a.reps)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                continue
            if best is None or secs < best[0]:
                best = (secs, batch)
        if best is not None:
            print(json.dumps({"impl": "pml-cuda", "device": name, "func": "knn", "Q": a.Q, "N": a.N,
                              "k": k, "batch_size": best[1], "median_s": best[0],
                              "gflops": 2 * a.Q * a.N * d / best[0] / 1e9}), flush=True)
    for case in a.mining:
        b, m, c, kind = case.split(",")
        b, m, c = int(b), int(m), int(c)
        emb = torch.randn(b, d, device=dev, generator=g)
        r = torch.randn(m, d, device=dev, generator=g)
        labels = torch.randint(0, c, (b,), device=dev, generator=g)
        ref_labels = torch.randint(0, c, (m,), device=dev, generator=g)
        try:
            if kind == "lmu":
                secs, out = timed(lambda: lmu.get_all_triplets_indices(labels, ref_labels), a.reps)
                func = "lmu"
            else:
                miner = miners.TripletMarginMiner(margin=0.2, type_of_triplets=kind)
                secs, out = timed(lambda: miner(emb, labels, r, ref_labels), a.reps)
                func = f"miner_{kind}"
        except torch.cuda.OutOfMemoryError as e:
            print(json.dumps({"impl": "pml-cuda", "device": name, "func": f"miner_{kind}", "B": b, "M": m,
                              "C": c, "error": f"CUDA out of memory: {str(e)[:120]}"}), flush=True)
            torch.cuda.empty_cache()
            continue
        print(json.dumps({"impl": "pml-cuda", "device": name, "func": func, "B": b, "M": m, "C": c,
                          "count": int(out[0].numel()), "median_s": secs}), flush=True)
    from pytorch_metric_learning import losses

    for case in a.loss:
        b, m, c, kind = case.split(",")
        b, m, c = int(b), int(m), int(c)
        func = f"loss_triplet_{kind}"
        emb = torch.nn.functional.normalize(torch.randn(b, d, device=dev, generator=g), dim=1)
        r = torch.nn.functional.normalize(torch.randn(m, d, device=dev, generator=g), dim=1)
        labels = torch.randint(0, c, (b,), device=dev, generator=g)
        ref_labels = torch.randint(0, c, (m,), device=dev, generator=g)
        loss_fn = losses.TripletMarginLoss()
        miner = None if kind == "all" else miners.TripletMarginMiner(margin=0.2, type_of_triplets=kind)

        def step():
            x = emb.clone().requires_grad_(True)
            tuples = miner(x, labels, r, ref_labels) if miner else None
            loss = loss_fn(x, labels, tuples, r, ref_labels)
            loss.backward()
            return loss.detach(), x.grad

        try:
            torch.cuda.reset_peak_memory_stats()
            secs, out = timed(step, a.reps)
        except torch.cuda.OutOfMemoryError as e:
            print(json.dumps({"impl": "pml-cuda", "device": name, "func": func, "B": b, "M": m, "C": c,
                              "error": f"CUDA out of memory: {str(e)[:120]}"}), flush=True)
            torch.cuda.empty_cache()
            continue
        print(json.dumps({"impl": "pml-cuda", "device": name, "func": func, "B": b, "M": m, "C": c,
                          "loss": float(out[0]), "median_s": secs,
                          "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20}), flush=True)

    for case in a.pair:
        nm, b, m, c = case.split(",")
        b, m, c = int(b), int(m), int(c)
        func = f"loss_pair_{nm}"
        emb = torch.nn.functional.normalize(torch.randn(b, d, device=dev, generator=g), dim=1)
        labels = torch.randint(0, c, (b,), device=dev, generator=g)
        r = torch.nn.functional.normalize(torch.randn(m, d, device=dev, generator=g), dim=1)
        ref_labels = torch.randint(0, c, (m,), device=dev, generator=g)
        # RankedListLoss has no defaults for these: the library's `RankedList::default()`.
        kwargs = {"margin": 0.4, "Tn": 1.0} if nm == "ranked_list" else {}
        loss_fn = getattr(losses, PAIR_LOSSES[nm])(**kwargs)

        def step():
            x = emb.clone().requires_grad_(True)
            if m:
                loss = loss_fn(x, labels, None, r, ref_labels)
            else:
                loss = loss_fn(x, labels)
            loss.backward()
            return loss.detach(), x.grad

        row = {"impl": "pml-cuda", "device": name, "func": func, "B": b, "M": m, "C": c}
        try:
            torch.cuda.reset_peak_memory_stats()
            secs, out = timed(step, a.reps)
        except Exception as e:  # out of memory, or a case PML refuses (its references)
            print(json.dumps({**row, "error": f"{type(e).__name__}: {str(e)[:120]}"}), flush=True)
            torch.cuda.empty_cache()
            continue
        print(json.dumps({**row, "loss": float(out[0]), "median_s": secs,
                          "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20}), flush=True)

    for case in a.classifier:
        kind, b, d_in, c = case.split(",")
        b, d_in, c = int(b), int(d_in), int(c)
        loss_fn = getattr(losses, CLASSIFIER_LOSSES[kind])(num_classes=c, embedding_size=d_in).to(dev)
        emb = torch.randn(b, d_in, device=dev, generator=g)
        labels = torch.randint(0, c, (b,), device=dev, generator=g)

        def step():
            x = emb.clone().requires_grad_(True)
            loss_fn.zero_grad(set_to_none=True)
            loss = loss_fn(x, labels)
            loss.backward()
            return loss.detach(), x.grad

        row = {"impl": "pml-cuda", "device": name, "func": f"classifier_{kind}", "B": b, "D": d_in,
               "C": c}
        try:
            torch.cuda.reset_peak_memory_stats()
            secs, out = timed(step, a.reps)
        except Exception as e:  # out of memory
            print(json.dumps({**row, "error": f"{type(e).__name__}: {str(e)[:120]}"}), flush=True)
            torch.cuda.empty_cache()
            continue
        print(json.dumps({**row, "loss": float(out[0]), "median_s": secs,
                          "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20}), flush=True)

    for case in a.infonce:
        b, d_in = (int(v) for v in case.split(","))
        items = torch.randn(b // 2, d_in, device=dev, generator=g)
        noise = lambda x: x + 1.5 * torch.randn(x.shape, device=dev, generator=g)
        views = torch.cat([noise(items), noise(items)])
        view_labels = torch.arange(b // 2, device=dev).repeat(2)
        anchors = torch.randn(b, d_in, device=dev, generator=g)
        positives = noise(anchors)
        for func, data in (("loss_ntxent", (views, view_labels)), ("loss_mnrl", (anchors, positives))):
            def step():
                x = data[0].clone().requires_grad_(True)
                if func == "loss_ntxent":
                    loss = ntxent_full(x, data[1], 0.07)
                else:
                    # Both sides' gradients, as the library's MNRL gives them.
                    loss = mnrl_full(x, data[1].clone().requires_grad_(True), 20.0)
                loss.backward()
                return loss.detach(), x.grad

            torch.cuda.reset_peak_memory_stats()
            secs, out = timed(step, a.reps)
            print(json.dumps({"impl": "torch-cuda", "device": name, "func": func, "B": b, "D": d_in,
                              "loss": float(out[0]), "median_s": secs,
                              "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20}), flush=True)


# bench_classifier's kinds and PML's classes.
CLASSIFIER_LOSSES = {
    "arcface": "ArcFaceLoss",
    "cosface": "CosFaceLoss",
    "normalized_softmax": "NormalizedSoftmaxLoss",
    "proxy_nca": "ProxyNCALoss",
}


# bench_mining's pair-loss names and PML's classes.
PAIR_LOSSES = {
    "contrastive": "ContrastiveLoss",
    "multi_similarity": "MultiSimilarityLoss",
    "supcon": "SupConLoss",
    "circle": "CircleLoss",
    "nca": "NCALoss",
    "generalized_lifted": "GeneralizedLiftedStructureLoss",
    "margin": "MarginLoss",
    "fast_ap": "FastAPLoss",
    "tcm": "ThresholdConsistentMarginLoss",
    "lifted": "LiftedStructureLoss",
    "histogram": "HistogramLoss",
    "ranked_list": "RankedListLoss",
    "intra_pair_variance": "IntraPairVarianceLoss",
    "n_pairs": "NPairsLoss",
    "instance": "InstanceLoss",
}


def ntxent_full(x, labels, temperature):
    """NTXent as one (B, B) matrix: each positive pair against its anchor's negatives."""
    import torch

    s = torch.nn.functional.normalize(x, dim=1)
    s = s @ s.T / temperature
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(x), dtype=torch.bool, device=x.device)
    neg = torch.where(same, torch.full_like(s, float("-inf")), s)
    neg_lse = torch.logsumexp(neg, dim=1, keepdim=True)
    a, p = (same & ~eye).nonzero(as_tuple=True)
    sp = s[a, p]
    return (torch.logaddexp(sp, neg_lse[a, 0]) - sp).mean()


def mnrl_full(anchors, positives, scale):
    """sentence-transformers' MultipleNegativesRankingLoss: cross-entropy over cosine scores."""
    import torch

    scores = torch.nn.functional.normalize(anchors, dim=1) @ torch.nn.functional.normalize(positives, dim=1).T
    return torch.nn.functional.cross_entropy(scores * scale, torch.arange(len(anchors), device=anchors.device))


if __name__ == "__main__":
    main()


