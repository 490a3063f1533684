"""PML's DynamicSoftMarginLoss as a drop-in against the real PML and torch's autograd: values,
gradients (through the histogram, as PML's autograd takes them) and the histogram carried
across calls; references; the out-of-range error; the fallbacks; the NumPy function."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pml = pytest.importorskip("pytorch_metric_learning")

from pytorch_metric_learning import distances, losses  # noqa: E402

import wgpu_metric_learning as wml  # noqa: E402
from test_losses import batch, value_and_grads  # noqa: E402
from wgpu_metric_learning import pml as drop  # noqa: E402

torch.set_num_threads(2)

PARAMS = [{}, {"min_val": -3.0, "num_bins": 20, "momentum": 0.1}, {"min_val": -2.5, "num_bins": 7}]


def assert_same(ours, theirs):
    (v1, g1), (v2, g2) = ours, theirs
    assert v1.item() == pytest.approx(v2.item(), rel=1e-5, abs=1e-6)
    for a, b in zip(g1, g2):
        top = max(b.abs().max().item(), 1e-3)
        assert (a - b).abs().max().item() <= 1e-4 * top


@pytest.mark.parametrize("kw", PARAMS)
@pytest.mark.parametrize("power", [1, 2])
def test_first_call_equals_pml(kw, power):
    kw = dict(kw, min_val=kw.get("min_val", -2.0) * power)
    dist = lambda: distances.LpDistance(power=power)  # noqa: E731
    for seed, classes in [(0, 4), (1, 8), (2, 2)]:
        x, y = batch(n=20, d=8, seed=seed, classes=classes)
        ours = drop.DynamicSoftMarginLoss(distance=dist(), backend="cpu", **kw)
        theirs = losses.DynamicSoftMarginLoss(distance=dist(), **kw)
        assert ours._library_can()
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))
        assert torch.allclose(ours.hist_, theirs.hist_.detach(), atol=1e-6)
        # With references and their gradient (fresh losses: PML's histogram starts over).
        r, ry = batch(n=14, d=8, seed=seed + 10, classes=classes)
        ours = drop.DynamicSoftMarginLoss(distance=dist(), backend="cpu", **kw)
        theirs = losses.DynamicSoftMarginLoss(distance=dist(), **kw)
        call = lambda f: lambda e, rr: f(e, y, None, rr, ry)  # noqa: E731
        assert_same(value_and_grads(call(ours), x, r), value_and_grads(call(theirs), x, r))


def test_the_histogram_carries_across_calls():
    ours, theirs = drop.DynamicSoftMarginLoss(momentum=0.2), losses.DynamicSoftMarginLoss(momentum=0.2)
    for step in range(4):
        x, y = batch(n=16, d=6, seed=30 + step, classes=3)
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))
        # PML's hist_ keeps this step's graph, and its next backward raises; a constant here.
        theirs.hist_ = theirs.hist_.detach()
        assert torch.allclose(ours.hist_, theirs.hist_, atol=1e-6)


def test_edges_errors_and_fallbacks():
    x, _ = batch(n=6, d=4, seed=3)
    # No triplet: no loss, and the histogram is not touched.
    ours, theirs = drop.DynamicSoftMarginLoss(), losses.DynamicSoftMarginLoss()
    y = torch.arange(6)
    assert ours(x, y).item() == theirs(x, y).item() == 0.0
    assert torch.count_nonzero(ours.hist_) == 0
    # A triplet outside the histogram: both raise.
    far = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.99, 0.1]])
    yf = torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match="min_val"):
        drop.DynamicSoftMarginLoss()(far, yf)
    with pytest.raises((IndexError, RuntimeError)):
        losses.DynamicSoftMarginLoss()(far, yf)
    # Without labels and with another reducer: PML's code.
    a, r = batch(n=5, d=4, seed=4)[0], batch(n=5, d=4, seed=5)[0]
    got = drop.DynamicSoftMarginLoss()(a, None, ref_emb=r)
    want = losses.DynamicSoftMarginLoss()(a, None, ref_emb=r)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert not drop.DynamicSoftMarginLoss(reducer=pml.reducers.SumReducer())._library_can()


def test_numpy_function():
    ctx = wml.Context(backend="cpu")
    x, y = batch(n=16, d=6, seed=8)
    loss, hist = wml.dynamic_soft_margin_loss(ctx, x.numpy(), y.numpy())
    theirs = losses.DynamicSoftMarginLoss()
    assert loss.loss == pytest.approx(theirs(x, y).item(), rel=1e-5)
    assert np.allclose(hist, theirs.hist_.detach().numpy(), atol=1e-6)
    again, _ = wml.dynamic_soft_margin_loss(ctx, x.numpy(), y.numpy(), histogram=hist)
    assert np.isfinite(again.loss)
    with pytest.raises(ValueError, match="histogram"):
        wml.dynamic_soft_margin_loss(ctx, x.numpy(), y.numpy(), histogram=[0.5, 0.5])
    with pytest.raises(ValueError, match="distance"):
        wml.dynamic_soft_margin_loss(ctx, x.numpy(), y.numpy(), distance="cosine")


def test_the_histogram_keeps_the_embeddings_dtype():
    x, y = batch(n=12, d=5, seed=9)
    ours, theirs = drop.DynamicSoftMarginLoss(), losses.DynamicSoftMarginLoss()
    got, want = ours(x.double(), y), theirs(x.double(), y)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert ours.hist_.dtype == torch.float64 == theirs.hist_.dtype
    assert torch.allclose(ours.hist_, theirs.hist_.detach(), atol=1e-6)
