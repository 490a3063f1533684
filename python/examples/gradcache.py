"""A GradCache step (Gao et al., 2021) with the library's MultipleNegativesRankingLoss.

The batch is embedded in mini-batches without keeping their graphs; the loss and the
embeddings' gradient come from the library (in row blocks: the (B, B) score matrix never
exists whole); then each mini-batch is embedded again with its graph and its slice of the
gradient pushed through the model. The parameters' gradient is the full-batch step's, with
the activation memory of one mini-batch.

    python python/examples/gradcache.py --batch 4096 --mini-batch 256
"""

import argparse
import time

import torch
import torch.nn.functional as F

from wgpu_metric_learning.pml import MultipleNegativesRankingLoss


def model_and_data(batch, dim_in=64, dim=32, seed=0):
    """A small two-layer encoder and (query, document) pairs, document = noisy query."""
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(dim_in, 128), torch.nn.Tanh(), torch.nn.Linear(128, dim)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    queries = torch.randn(batch, dim_in, generator=g)
    docs = queries + 0.5 * torch.randn(batch, dim_in, generator=g)
    return model, queries, docs


def cached_step(model, queries, docs, mini_batch, loss_fn):
    """GradCache: embeddings without graphs, the loss's gradient from the library, then the
    model's backward mini-batch by mini-batch."""
    model.zero_grad()
    with torch.no_grad():
        q = torch.cat([model(c) for c in queries.split(mini_batch)])
        d = torch.cat([model(c) for c in docs.split(mini_batch)])
    q.requires_grad_(True)
    d.requires_grad_(True)
    loss = loss_fn(q, d)
    loss.backward()  # q.grad and d.grad, computed by the library
    for inputs, grads in ((queries, q.grad), (docs, d.grad)):
        for chunk, grad in zip(inputs.split(mini_batch), grads.split(mini_batch)):
            model(chunk).backward(grad)
    return loss.item()


def full_step(model, queries, docs, scale):
    """The same step with the whole graph and the whole (B, B) score matrix, in torch."""
    model.zero_grad()
    q, d = model(queries), model(docs)
    scores = F.normalize(q, dim=1) @ F.normalize(d, dim=1).T * scale
    loss = F.cross_entropy(scores, torch.arange(len(q)))
    loss.backward()
    return loss.item()


def compare(batch=256, mini_batch=32, seed=0, scale=20.0, backend="auto"):
    """Runs both steps on the same model and data; returns each one's loss, parameter
    gradients and seconds."""
    model, queries, docs = model_and_data(batch, seed=seed)
    loss_fn = MultipleNegativesRankingLoss(scale=scale, backend=backend)
    results = []
    for step in (lambda: cached_step(model, queries, docs, mini_batch, loss_fn),
                 lambda: full_step(model, queries, docs, scale)):
        start = time.perf_counter()
        loss = step()
        seconds = time.perf_counter() - start
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        results.append({"loss": loss, "grads": grads, "seconds": seconds})
    return results[0], results[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--mini-batch", type=int, default=256)
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    cached, full = compare(args.batch, args.mini_batch, scale=args.scale, backend=args.backend)
    worst = max(
        ((cached["grads"][n] - g).abs().max() / g.abs().max().clamp_min(1e-12)).item()
        for n, g in full["grads"].items()
    )
    print(f"loss: GradCache with the library {cached['loss']:.6f}, full batch in torch {full['loss']:.6f}")
    print(f"largest relative difference of a parameter gradient: {worst:.2e}")
    print(f"seconds: {cached['seconds']:.3f} (GradCache) vs {full['seconds']:.3f} (full batch)")


if __name__ == "__main__":
    main()
