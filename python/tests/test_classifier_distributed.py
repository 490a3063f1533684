"""The drop-ins' ``distributed="replicated"|"sharded"`` over torch.distributed (gloo, 2 and 3
processes on this machine) against one process on the concatenated batch: the same loss on
every rank, each rank's embeddings' gradient the single process's times the world size
(DDP's averaging then gives it back), and the weights' gradient the single process's (whole
when replicated, the rank's classes when sharded). Uneven batches, classes absent from the
batch, an empty rank, and ProxyAnchor (whose terms couple the rows of every rank) included;
PartialFC's sampling (the same classes drawn as one process draws); a sharded loss refusing
DistributedDataParallel; replicated weights' checksums."""

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
        # The first call on both sides: the same seed, the same classes drawn.
        extra = dict(sample_rate=0.4, seed=3) if mode.endswith("sampled") else {}
        mode = mode.split("+")[0]
        # One process on every row and the whole W.
        single, attr = _make(name, **extra)
        xs = x.clone().requires_grad_(True)
        single_value = single(xs, y)
        single_value.backward()
        w_whole = getattr(single, attr).detach()
        w_grad = getattr(single, attr).grad.detach()
        per = getattr(single, "sub_centers", getattr(single, "centers_per_class", 1))
        on_rows = LOSSES[name][2]
        if mode == "sharded":
            first, end = CLASSES * rank // size, CLASSES * (rank + 1) // size
            loss, attr = _make(name, distributed="sharded", **extra)
            cols = slice(first * per, end * per)
            mine = w_whole[cols] if on_rows else w_whole[:, cols]
            setattr(loss, attr, torch.nn.Parameter(mine.clone()))
            expected_w = w_grad[cols] if on_rows else w_grad[:, cols]
        else:
            loss, attr = _make(name, distributed="replicated", **extra)
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
            abs(float(value) - float(single_value)) <= 1e-5 * abs(float(value)),
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
] + [
    ("ArcFaceLoss", "sharded+sampled", 3),
    ("SoftTripleLoss", "replicated+sampled", 2),
]


def _spawn(worker, size, *args):
    """``worker(rank, size, init, *args, results)`` in ``size`` processes of one gloo group:
    what each put in ``results``, in rank order; every process must exit cleanly."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=worker, args=(r, size, init, *args, results)) for r in range(size)
        ]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=120) for _ in range(size))
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    return got


@pytest.mark.parametrize("name, mode, size", CASES)
def test_distributed_drop_ins_match_one_process(name, mode, size):
    got = _spawn(_worker, size, name, mode)
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


def _guard_worker(rank, size, init, results):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel
        got = {}
        torch.manual_seed(1)
        x, y = torch.randn(4, D), torch.tensor([0, 3, 6, 9])

        def sharded():
            loss = pml.ArcFaceLoss(
                num_classes=10, embedding_size=D, backend="cpu", distributed="sharded"
            )
            # 10 classes over 2 ranks: 5 each, the same shape on both (DDP would not notice).
            loss.W = torch.nn.Parameter(loss.W.data[:, 5 * rank:5 * rank + 5].clone())
            return loss

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(D, D)
                self.loss = sharded()

            def forward(self, x, y):
                return self.loss(self.lin(x), y)

        for what, make in [("direct", sharded), ("nested", Model)]:
            try:
                ddp(make())(x, y)
                got[what] = "ran"
            except RuntimeError as e:
                got[what] = str(e)
        # Listed in DDP's parameters to ignore: the shard stays the rank's own.
        model = Model()
        ddp._set_params_and_buffers_to_ignore_for_model(model, ["loss.W"])
        mine = model.loss.W.detach().clone()
        ddp(model)(x, y).backward()
        got["ignored"] = torch.equal(model.loss.W.detach(), mine)
        # Replicated: checked every 2nd call; a drift after the broadcast is caught.
        rep = pml.ArcFaceLoss(
            num_classes=10, embedding_size=D, backend="cpu", distributed="replicated",
            check_every=2,
        )
        for _ in range(3):
            rep(x, y)
        if rank == 1:
            rep.W.data[0, 0] += 1e-3
        rep(x, y)
        try:
            rep(x, y)
            got["drift"] = "ran"
        except RuntimeError as e:
            got["drift"] = str(e)
        results.put((rank, got))
    finally:
        dist.destroy_process_group()


def test_sharded_weights_refuse_ddp_and_replicas_are_checked():
    for rank, out in _spawn(_guard_worker, 2):
        assert "DistributedDataParallel would broadcast" in out["direct"], (rank, out["direct"])
        assert "already copied rank 0's shard" in out["nested"], (rank, out["nested"])
        assert out["ignored"] is True, rank
        assert "replicated weights differ between ranks" in out["drift"], (rank, out["drift"])
