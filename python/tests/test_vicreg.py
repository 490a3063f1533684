"""PML's VICRegLoss as a drop-in against the real PML and torch's autograd: values and both
views' gradients on either side of n = d (the library's Gram matrix switches there), one view,
PML's hyperparameters, the fallbacks to PML's own code, and the NumPy function."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pml = pytest.importorskip("pytorch_metric_learning")

from pytorch_metric_learning import losses  # noqa: E402

import wgpu_metric_learning as wml  # noqa: E402
from test_losses import value_and_grads  # noqa: E402
from wgpu_metric_learning import pml as drop  # noqa: E402

torch.set_num_threads(2)

HYPERPARAMETERS = [(25, 25, 1, 1e-4), (10, 10, 2, 1e-5), (5, 5, 5, 1e-6)]


def views(n, d, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
    return z.float(), (z + 0.1 * torch.randn(n, d, generator=g, dtype=torch.float64)).float()


def assert_same(ours, theirs):
    """Values within 1e-5 relative, gradients within 1e-4 of their largest element."""
    (v1, g1), (v2, g2) = ours, theirs
    assert v1.item() == pytest.approx(v2.item(), rel=1e-5, abs=1e-6)
    for a, b in zip(g1, g2):
        top = max(b.abs().max().item(), 1e-3)
        assert (a - b).abs().max().item() <= 1e-4 * top


@pytest.mark.parametrize("hyp", HYPERPARAMETERS)
@pytest.mark.parametrize("shape", [(32, 64), (64, 16), (24, 24), (2, 5)])
def test_vicreg_equals_pml(hyp, shape):
    kw = dict(zip(("invariance_lambda", "variance_mu", "covariance_v", "eps"), hyp))
    ours, theirs = drop.VICRegLoss(backend="cpu", **kw), losses.VICRegLoss(**kw)
    assert ours._library_can()
    for seed, scale in [(0, 1.0), (1, 0.3), (2, 3.0)]:
        z, z2 = views(*shape, seed, scale)
        call = lambda f: lambda a, b: f(a, ref_emb=b)  # noqa: E731
        assert_same(value_and_grads(call(ours), z, z2), value_and_grads(call(theirs), z, z2))
        # One view: PML's ref_emb is the embeddings themselves.
        assert_same(value_and_grads(ours, z), value_and_grads(theirs, z))


def test_vicreg_fallbacks_run_pmls_code():
    z, z2 = views(8, 4, 3)
    ours, theirs = drop.VICRegLoss(), losses.VICRegLoss()
    # Labels and an indices_tuple: PML's code raises as PML's does.
    for args in [(z, torch.arange(8)), (z, None, (torch.arange(2), torch.arange(2)))]:
        kinds = []
        for loss in (ours, theirs):
            with pytest.raises(Exception) as caught:
                loss(*args)
            kinds.append(caught.type)
        assert kinds[0] is kinds[1]
    # One row (PML's variance is NaN), and eps 0: PML's code.
    one = ours(z[:1], ref_emb=z2[:1])
    assert torch.isnan(one) == torch.isnan(theirs(z[:1], ref_emb=z2[:1]))
    zero = drop.VICRegLoss(eps=0)
    assert not zero._library_can()
    assert zero(z, ref_emb=z2).item() == pytest.approx(
        losses.VICRegLoss(eps=0)(z, ref_emb=z2).item(), rel=1e-6
    )
    other = drop.VICRegLoss(reducer=pml.reducers.SumReducer())
    assert not other._library_can()


def test_vicreg_numpy_function():
    ctx = wml.Context(backend="cpu")
    z, z2 = views(16, 40, 4)
    out = wml.vicreg_loss(ctx, z.numpy(), z2.numpy(), covariance_v=2.0)
    want = losses.VICRegLoss(covariance_v=2.0)(z, ref_emb=z2).item()
    assert out.loss == pytest.approx(want, rel=1e-5)
    assert out.loss == pytest.approx(out.invariance + out.variance + out.covariance, rel=1e-6)
    assert out.grad.shape == (16, 40) and out.ref_grad.shape == (16, 40)
    single = wml.vicreg_loss(ctx, z.numpy())
    assert single.invariance == 0.0 and single.ref_grad is None
    with pytest.raises(ValueError, match="n >= 2"):
        wml.vicreg_loss(ctx, z.numpy()[:1])
    with pytest.raises(ValueError, match="refs"):
        wml.vicreg_loss(ctx, z.numpy(), z2.numpy()[:, :3])
    with pytest.raises(ValueError, match="eps"):
        wml.vicreg_loss(ctx, z.numpy(), eps=0.0)
    bad = z.numpy().copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError):
        wml.vicreg_loss(ctx, bad)
