"""Class-weight checkpoints from Python (``distributed.save_class_weights`` and
``load_class_weights``): a drop-in's weights and torch's optimizer state (SGD's momentum,
AdamW's moments and step) saved and restored exactly, so the next step is the one an unbroken
run takes; a checkpoint saved by 2 sharded ranks loaded on 3; the refusals."""

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist

from test_classifier_distributed import _spawn
from wgpu_metric_learning import pml
from wgpu_metric_learning.distributed import load_class_weights, save_class_weights

D, CLASSES = 6, 11


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(9, D, generator=g), torch.randint(0, CLASSES, (9,), generator=g)


def _train(loss, opt, seeds):
    for s in seeds:
        x, y = _batch(s)
        opt.zero_grad()
        loss(x, y).backward()
        opt.step()


CASES = [
    (lambda: pml.ArcFaceLoss(num_classes=CLASSES, embedding_size=D, backend="cpu"), "W",
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3)),
    (lambda: pml.ProxyAnchorLoss(num_classes=CLASSES, embedding_size=D, backend="cpu"), "proxies",
     lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.99))),
    (lambda: pml.SubCenterArcFaceLoss(num_classes=CLASSES, embedding_size=D, sub_centers=2,
                                      backend="cpu"), "W",
     lambda p: torch.optim.AdamW(p, lr=0.01)),
]


@pytest.mark.parametrize("make, attr, optimizer", CASES)
def test_a_resumed_run_is_the_unbroken_run(make, attr, optimizer, tmp_path):
    torch.manual_seed(0)
    loss = make()
    opt = optimizer(loss.parameters())
    _train(loss, opt, [1, 2])
    save_class_weights(loss, str(tmp_path), opt)
    torch.manual_seed(7)  # other weights, which the load replaces
    resumed = make()
    resumed_opt = optimizer(resumed.parameters())
    load_class_weights(resumed, str(tmp_path), resumed_opt)
    assert torch.equal(getattr(resumed, attr), getattr(loss, attr))
    before, after = opt.state[getattr(loss, attr)], resumed_opt.state[getattr(resumed, attr)]
    assert sorted(before) == sorted(after)
    for key in before:
        assert torch.equal(torch.as_tensor(before[key]), torch.as_tensor(after[key])), key
    # The next step is the unbroken run's, bit for bit.
    _train(loss, opt, [3])
    _train(resumed, resumed_opt, [3])
    assert torch.equal(getattr(resumed, attr), getattr(loss, attr))


def test_weights_alone_and_the_refusals(tmp_path):
    torch.manual_seed(0)
    loss = pml.ArcFaceLoss(num_classes=CLASSES, embedding_size=D, backend="cpu")
    save_class_weights(loss, str(tmp_path / "plain"))
    other = pml.ArcFaceLoss(num_classes=CLASSES, embedding_size=D, backend="cpu")
    load_class_weights(other, str(tmp_path / "plain"))
    assert torch.equal(other.W, loss.W)
    # Another number of classes, another optimizer's state, an optimizer without the weights.
    smaller = pml.ArcFaceLoss(num_classes=CLASSES - 1, embedding_size=D, backend="cpu")
    with pytest.raises(ValueError, match="holds 11 classes"):
        load_class_weights(smaller, str(tmp_path / "plain"))
    opt = torch.optim.AdamW(loss.parameters(), lr=0.01)
    _train(loss, opt, [1])
    save_class_weights(loss, str(tmp_path / "adam"), opt)
    with pytest.raises(ValueError, match="adamw"):
        load_class_weights(other, str(tmp_path / "adam"), torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="does not hold"):
        save_class_weights(loss, str(tmp_path / "x"), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1))
    with pytest.raises(TypeError, match="SGD or torch.optim.AdamW"):
        save_class_weights(loss, str(tmp_path / "x"), torch.optim.Adagrad(loss.parameters()))
    # A damaged shard is the library's error, and the weights are left as they were.
    shard = next(f for f in os.listdir(tmp_path / "adam") if f.endswith(".wmlc"))
    with open(tmp_path / "adam" / shard, "r+b") as f:
        f.truncate(os.path.getsize(tmp_path / "adam" / shard) - 5)
    kept = other.W.detach().clone()
    with pytest.raises(Exception, match="wmlc"):
        load_class_weights(other, str(tmp_path / "adam"))
    assert torch.equal(other.W, kept)


def _sharded_worker(rank, size, init, directory, phase, results):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        first, end = CLASSES * rank // size, CLASSES * (rank + 1) // size
        loss = pml.ArcFaceLoss(num_classes=end - first, embedding_size=D, backend="cpu",
                               distributed="sharded")
        opt = torch.optim.SGD(loss.parameters(), lr=0.1, momentum=0.9)
        if phase == "save":
            torch.manual_seed(rank)
            loss.W.data.normal_()
            x, y = _batch(rank)
            opt.zero_grad()
            loss(x, y % CLASSES).backward()
            opt.step()
            save_class_weights(loss, directory, opt)
        else:
            load_class_weights(loss, directory, opt)
        buf = opt.state[loss.W]["momentum_buffer"]
        results.put((rank, loss.W.detach().numpy().copy(), buf.numpy().copy()))
    finally:
        dist.destroy_process_group()


def test_two_sharded_ranks_save_and_three_load():
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "ckpt")
        saved = _spawn(_sharded_worker, 2, directory, "save")
        loaded = _spawn(_sharded_worker, 3, directory, "load")
    whole = lambda got, i: np.concatenate([g[i] for g in got], axis=1)
    assert np.array_equal(whole(loaded, 1), whole(saved, 1))
    assert np.array_equal(whole(loaded, 2), whole(saved, 2))


def _replicated_worker(rank, size, init, directory, results):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        torch.manual_seed(0)
        loss = pml.ArcFaceLoss(num_classes=CLASSES, embedding_size=D, backend="cpu",
                               distributed="replicated")
        # One rank's optimizer has no counterpart: every rank raises, none waits.
        bad = torch.optim.Adagrad(loss.parameters()) if rank == 1 else None
        try:
            save_class_weights(loss, directory, bad)
            failed = ""
        except RuntimeError as e:
            failed = str(e)
        opt = torch.optim.SGD(loss.parameters(), lr=0.1, momentum=0.9)
        x, y = _batch(rank)
        opt.zero_grad()
        loss(x, y).backward()
        opt.step()
        save_class_weights(loss, directory, opt)
        restored = pml.ArcFaceLoss(num_classes=CLASSES, embedding_size=D, backend="cpu",
                                   distributed="replicated")
        restored_opt = torch.optim.SGD(restored.parameters(), lr=0.1, momentum=0.9)
        load_class_weights(restored, directory, restored_opt)
        same = torch.equal(restored.W, loss.W) and torch.equal(
            restored_opt.state[restored.W]["momentum_buffer"], opt.state[loss.W]["momentum_buffer"]
        )
        results.put((rank, failed, same))
    finally:
        dist.destroy_process_group()


def test_replicated_ranks_save_once_and_fail_together():
    with tempfile.TemporaryDirectory() as tmp:
        got = _spawn(_replicated_worker, 2, os.path.join(tmp, "ckpt"))
    for rank, failed, same in got:
        assert "rank 1" in failed and "Adagrad" in failed, (rank, failed)
        assert same, rank
