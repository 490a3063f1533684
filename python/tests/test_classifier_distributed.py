"""The drop-ins' ``distributed="replicated"|"sharded"`` over torch.distributed (gloo, 2 and 3
processes on this machine) against one process on the concatenated batch: the same loss on
every rank, each rank's embeddings' gradient the single process's times the world size
(DDP's averaging then gives it back), and the weights' gradient the single process's (whole
when replicated, the rank's classes when sharded). Uneven batches, classes absent from the
batch, an empty rank, and ProxyAnchor (whose terms couple the rows of every rank) included."""

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from wgpu_metric_learning import pml

D, CLASSES = 6, 11
LOSSES = {
    "ArcFaceLoss": (lambda: pml.ArcFaceLoss, "W", False),
    "SubCenterArcFaceLoss": (lambda: pml.SubCenterArcFaceLoss, "W", False),
    "ProxyAnchorLoss": (lambda: pml.ProxyAnchorLoss, "proxies", True),
    "SoftTripleLoss": (lambda: pml.SoftTripleLoss, "fc", False),
}


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    # Rank 1 has no rows: the others' rows are its loss too.
    rows = [3, 0, 7, 5]
    x = torch.randn(sum(rows), D, generator=g)
    # Classes 8..10 never appear.
    y = torch.randint(0, CLASSES - 3, (sum(rows),), generator=g)
    return x, y, rows


def _make(name, **kwargs):
    cls, attr, _ = LOSSES[name]
    kw = dict(num_classes=CLASSES, embedding_size=D, backend="cpu", **kwargs)
    torch.manual_seed(3)
    return cls()(**kw), attr


def _worker(rank, size, init, name, mode, results):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        x, y, rows = _data(5)
        cuts = np.cumsum([0] + [rows[r % len(rows)] for r in range(size)])
        x, y = x[: cuts[-1]], y[: cuts[-1]]
        # One process on every row and the whole W.
        single, attr = _make(name)
        xs = x.clone().requires_grad_(True)
        single(xs, y).backward()
        w_whole = getattr(single, attr).detach()
        w_grad = getattr(single, attr).grad.detach()
        per = getattr(single, "sub_centers", getattr(single, "centers_per_class", 1))
        on_rows = LOSSES[name][2]
        if mode == "sharded":
            first, end = CLASSES * rank // size, CLASSES * (rank + 1) // size
            loss, attr = _make(name, distributed="sharded")
            cols = slice(first * per, end * per)
            mine = w_whole[cols] if on_rows else w_whole[:, cols]
            setattr(loss, attr, torch.nn.Parameter(mine.clone()))
            expected_w = w_grad[cols] if on_rows else w_grad[:, cols]
        else:
            loss, attr = _make(name, distributed="replicated")
            if rank > 0:
                # Different W on the other ranks: the first call broadcasts rank 0's.
                getattr(loss, attr).data.add_(1.0)
            expected_w = w_grad
        a, b = cuts[rank], cuts[rank + 1]
        xr = x[a:b].clone().requires_grad_(True)
        value = loss(xr, y[a:b])
        value.backward()
        top = float(xs.grad.abs().max()) * size
        results.put((
            rank,
            abs(float(value) - float(single(x, y))) <= 1e-5 * abs(float(value)),
            torch.allclose(xr.grad, xs.grad[a:b] * size, rtol=0, atol=1e-5 * top),
            torch.allclose(
                getattr(loss, attr).grad, expected_w, rtol=0,
                atol=1e-5 * float(w_grad.abs().max()),
            ),
        ))
    finally:
        dist.destroy_process_group()


CASES = [
    (name, mode, size)
    for name in sorted(LOSSES)
    for mode in ("replicated", "sharded")
    # Two and three processes for ArcFace, three for the others (each case spawns them all).
    for size in ((2, 3) if name == "ArcFaceLoss" else (3,))
]


@pytest.mark.parametrize("name, mode, size", CASES)
def test_distributed_drop_ins_match_one_process(name, mode, size):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_worker, args=(r, size, init, name, mode, results))
            for r in range(size)
        ]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=120) for _ in range(size))
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    for rank, value_ok, grad_ok, weight_ok in got:
        assert value_ok, f"rank {rank}: loss differs"
        assert grad_ok, f"rank {rank}: embeddings' gradient differs"
        assert weight_ok, f"rank {rank}: weights' gradient differs"


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="distributed must be"):
        pml.ArcFaceLoss(num_classes=3, embedding_size=2, distributed="ddp")


def test_what_only_pml_runs_is_refused_when_distributed():
    loss = pml.ArcFaceLoss(num_classes=3, embedding_size=2, distributed="replicated")
    x = torch.randn(4, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="runs only on the library's path"):
        loss(x, torch.tensor([0, 1, 2, 0]))
