"""PML's losses with class weights (ArcFace and its family) as drop-ins against the real PML
and torch's autograd through PML's code: values, the embeddings' and the weights' gradients
(which PML's own tests never check), float64, ArcFace's else branch and |cos| = 1, that the
library ran, the fallbacks to PML's code, and the NumPy function."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pml = pytest.importorskip("pytorch_metric_learning")

from pytorch_metric_learning import losses, regularizers  # noqa: E402

import wgpu_metric_learning as wml  # noqa: E402
from wgpu_metric_learning import _native  # noqa: E402
from wgpu_metric_learning import pml as drop  # noqa: E402

torch.set_num_threads(2)

# (class name, constructor keywords beyond num_classes and embedding_size, weights attribute)
CASES = [
    ("ArcFaceLoss", {}, "W"),
    ("ArcFaceLoss", {"margin": 60, "scale": 16}, "W"),
    ("SubCenterArcFaceLoss", {"sub_centers": 3}, "W"),
    ("SubCenterArcFaceLoss", {"sub_centers": 1, "scale": 8}, "W"),
    ("CosFaceLoss", {}, "W"),
    ("CosFaceLoss", {"margin": 0.2, "scale": 30}, "W"),
    ("LargeMarginSoftmaxLoss", {}, "W"),
    ("LargeMarginSoftmaxLoss", {"margin": 3, "scale": 2}, "W"),
    ("SphereFaceLoss", {}, "W"),
    ("SphereFaceLoss", {"margin": 2, "scale": 0.5}, "W"),
    ("NormalizedSoftmaxLoss", {}, "W"),
    ("NormalizedSoftmaxLoss", {"temperature": 0.5}, "W"),
    ("ProxyNCALoss", {}, "proxies"),
    ("ProxyNCALoss", {"softmax_scale": 8}, "proxies"),
    ("ProxyAnchorLoss", {}, "proxies"),
    ("ProxyAnchorLoss", {"margin": 0.3, "alpha": 8}, "proxies"),
    ("SoftTripleLoss", {}, "fc"),
    ("SoftTripleLoss", {"centers_per_class": 3, "la": 10, "gamma": 0.5, "margin": 0.1}, "fc"),
]


def pair(name, kw, classes, d):
    """Ours and PML's with the same weights."""
    kw = dict(kw, num_classes=classes, embedding_size=d)
    theirs = getattr(losses, name)(**kw)
    ours = getattr(drop, name)(backend="cpu", **kw)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def run(loss, x, labels, attr):
    x = x.detach().clone().requires_grad_(True)
    w = getattr(loss, attr)
    w.grad = None
    value = loss(x, labels)
    value.backward()
    return value.detach(), x.grad.detach(), w.grad.detach().clone()


def assert_same(ours, theirs, what):
    """Values within 1e-5 relative, gradients within 1e-4 of their largest element."""
    (v1, *g1), (v2, *g2) = ours, theirs
    assert v1.item() == pytest.approx(v2.item(), rel=1e-5, abs=1e-6), what
    for a, b, which in zip(g1, g2, ("embeddings", "weights")):
        top = max(b.abs().max().item(), 1e-3)
        err = (a.double() - b.double()).abs().max().item()
        assert err <= 1e-4 * top, f"{what}: {which} gradient off by {err} (top {top})"


class Spy:
    """Counts the library's calls."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = _native.classifier_loss

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(_native, "classifier_loss", spy)


@pytest.mark.parametrize("name,kw,attr", CASES)
def test_equals_pml_values_and_gradients(name, kw, attr, monkeypatch):
    spy = Spy(monkeypatch)
    for seed, (b, d, classes), dtype in [
        (0, (64, 32, 10), torch.float32),
        (1, (33, 7, 3), torch.float32),
        (2, (48, 16, 25), torch.float64),
    ]:
        torch.manual_seed(seed)
        ours, theirs = pair(name, kw, classes, d)
        x = torch.randn(b, d, dtype=dtype) * 2
        labels = torch.randint(0, classes, (b,))
        what = f"{name}{kw} seed {seed}"
        assert_same(run(ours, x, labels, attr), run(theirs, x, labels, attr), what)
    assert spy.calls == 3


def test_arcface_at_the_edges():
    """PML's test grid (unit 2-D embeddings at 0…179°): the else branch (θ > π − m) is taken;
    and rows exactly along their class's weight, where PML's gradient is infinite and ours is
    held finite (documented)."""
    torch.manual_seed(3)
    ours, theirs = pair("ArcFaceLoss", {"margin": 30}, 10, 2)
    angles = torch.arange(0, 180, dtype=torch.float64) * math.pi / 180
    x = torch.stack([torch.cos(angles), torch.sin(angles)], 1).float()
    labels = torch.randint(0, 10, (180,))
    value = run(ours, x, labels, "W")[0]
    assert value.item() == pytest.approx(run(theirs, x, labels, "W")[0].item(), rel=1e-5)
    # Gradients on the rows at least 3° from their class's weight: nearer, the slope
    # sin(θ + m) / sin θ magnifies f32 rounding of the cosine (PML's as much as ours) past 1e-4.
    w = torch.nn.functional.normalize(theirs.W.detach().double(), dim=0)
    cos = (x.double() @ w)[torch.arange(180), labels]
    theta = torch.rad2deg(torch.acos(cos.clamp(-1, 1)))
    keep = theta >= 3
    assert (theta[keep] > 180 - 30).any(), "the else branch is taken"
    assert_same(run(ours, x[keep], labels[keep], "W"), run(theirs, x[keep], labels[keep], "W"), "grid")
    with torch.no_grad():
        w = ours.W.detach().clone()
    along = (w[:, :4] / w[:, :4].norm(dim=0)).t().contiguous() * 3
    value, gx, gw = run(ours, along, torch.arange(4), "W")
    assert torch.isfinite(value) and torch.isfinite(gx).all() and torch.isfinite(gw).all()


def test_straight_through_margin_gradient():
    """insightface's: the target's slope is the plain scale."""
    torch.manual_seed(4)
    ours = drop.ArcFaceLoss(num_classes=5, embedding_size=8, margin_grad="straight_through")
    x = torch.randn(16, 8, requires_grad=True)
    labels = torch.randint(0, 5, (16,))
    ours(x, labels).backward()
    # Against autograd through PML's logits with the margin added under no_grad.
    w = ours.W.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    cos = torch.nn.functional.normalize(x2) @ torch.nn.functional.normalize(w, dim=0)
    with torch.no_grad():
        t = cos[torch.arange(16), labels]
        theta = torch.acos(t.clamp(-1, 1))
        shifted = torch.where(
            theta <= math.pi - ours.margin, torch.cos(theta + ours.margin),
            t - ours.margin * math.sin(ours.margin),
        )
        delta = torch.zeros_like(cos)
        delta[torch.arange(16), labels] = shifted - t
    torch.nn.functional.cross_entropy((cos + delta) * 64, labels).backward()
    assert (x.grad - x2.grad).abs().max().item() <= 1e-4 * x2.grad.abs().max().item()
    assert (ours.W.grad - w.grad).abs().max().item() <= 1e-4 * w.grad.abs().max().item()


def test_fallbacks_run_pmls_code(monkeypatch):
    spy = Spy(monkeypatch)
    torch.manual_seed(5)
    x = torch.randn(12, 6)
    labels = torch.randint(0, 4, (12,))
    # A miner's indices_tuple (miner weights), another reducer, a regularizer: PML's code.
    ours, theirs = pair("CosFaceLoss", {}, 4, 6)
    mined = (torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5]))
    assert ours(x, labels, mined).item() == pytest.approx(theirs(x, labels, mined).item())
    summed = drop.CosFaceLoss(
        num_classes=4, embedding_size=6, reducer=pml.reducers.SumReducer()
    )
    assert not summed._library_can()
    reg = drop.ArcFaceLoss(
        num_classes=4, embedding_size=6, weight_regularizer=regularizers.RegularFaceRegularizer()
    )
    assert not reg._library_can()
    assert spy.calls == 0
    # SGD on the drop-in's parameters, as PML users write it.
    ours, _ = pair("ArcFaceLoss", {}, 4, 6)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    before = ours.W.detach().clone()
    ours(x, labels).backward()
    opt.step()
    assert not torch.equal(before, ours.W.detach()) and spy.calls == 1


def test_numpy_function():
    ctx = wml.Context(backend="cpu")
    torch.manual_seed(6)
    theirs = losses.CosFaceLoss(num_classes=7, embedding_size=5, scale=30)
    x = torch.randn(9, 5)
    labels = torch.randint(0, 7, (9,))
    out = wml.classifier_loss(
        ctx, x.numpy(), labels.numpy(), theirs.W.detach().numpy(), "cosface", scale=30
    )
    assert out.loss == pytest.approx(theirs(x, labels).item(), rel=1e-5)
    assert out.count == 9 and out.grad.shape == (9, 5) and out.weight_grad.shape == (5, 7)
    w = theirs.W.detach().numpy()
    with pytest.raises(ValueError, match="temperature"):
        wml.classifier_loss(ctx, x.numpy(), labels.numpy(), w, "cosface", temperature=0.1)
    with pytest.raises(ValueError, match="labels"):
        wml.classifier_loss(ctx, x.numpy(), labels.numpy() + 7, w, "cosface")
    with pytest.raises(ValueError, match="weights"):
        wml.classifier_loss(ctx, x.numpy(), labels.numpy(), w.T, "cosface")
    with pytest.raises(ValueError, match="margin_grad"):
        wml.classifier_loss(ctx, x.numpy(), labels.numpy(), w, "arcface", margin_grad="x")
    with pytest.raises(ValueError, match="loss"):
        wml.classifier_loss(ctx, x.numpy(), labels.numpy(), w, "no_such_loss")


@pytest.mark.parametrize(
    "name,kw,attr",
    [
        ("ArcFaceLoss", {}, "W"),
        ("SubCenterArcFaceLoss", {"sub_centers": 2}, "W"),
        ("CosFaceLoss", {}, "W"),
        ("ProxyNCALoss", {}, "proxies"),
        ("SoftTripleLoss", {"centers_per_class": 2}, "fc"),
    ],
)
def test_sampling_is_pml_over_the_classes_it_keeps(name, kw, attr):
    """PartialFC's sampling: PML's loss over the kept classes (every class with a row, and
    those drawn), its weights' gradient on them and 0 elsewhere; a new draw every call."""
    classes, d, b = 300, 12, 20
    torch.manual_seed(11)
    ours, _ = pair(name, kw, classes, d)
    sampled = getattr(drop, name)(
        backend="cpu", num_classes=classes, embedding_size=d, sample_rate=0.1, seed=5, **kw
    )
    sampled.load_state_dict(ours.state_dict())
    per = kw.get("sub_centers", kw.get("centers_per_class", 1))
    on_rows = attr == "proxies"
    x = torch.randn(b, d) * 2
    labels = torch.randint(0, classes, (b,))
    draws = []
    for call in range(2):
        kept = _native.sampled_classes(classes, labels.numpy(), 0.1, 5 + call)
        draws.append(tuple(kept))
        assert set(labels.tolist()) <= set(kept.tolist())
        assert len(kept) < classes // 3
        centres = torch.tensor([c * per + t for c in kept.tolist() for t in range(per)])
        w = getattr(ours, attr).detach()
        part = w[centres] if on_rows else w[:, centres]
        theirs = getattr(losses, name)(num_classes=len(kept), embedding_size=d, **kw)
        getattr(theirs, attr).data.copy_(part)
        relabel = torch.searchsorted(torch.from_numpy(kept), labels)
        value, gx, gw = run(sampled, x, labels, attr)
        v2, gx2, gw2 = run(theirs, x, relabel, attr)
        whole = torch.zeros_like(w)
        if on_rows:
            whole[centres] = gw2
        else:
            whole[:, centres] = gw2
        assert_same((value, gx, gw), (v2, gx2, whole), f"{name} call {call}")
    assert draws[0] != draws[1], "a new draw each call"


def test_sampling_refusals():
    with pytest.raises(ValueError, match="sample_rate must be in"):
        drop.ArcFaceLoss(num_classes=3, embedding_size=2, sample_rate=0)
    with pytest.raises(ValueError, match="ProxyAnchorLoss"):
        drop.ProxyAnchorLoss(num_classes=3, embedding_size=2, sample_rate=0.5)
    with pytest.raises(ValueError, match="check_every"):
        drop.ArcFaceLoss(num_classes=3, embedding_size=2, check_every=5)
    # What only PML's code runs cannot sample: an error, not a silent full softmax.
    loss = drop.ArcFaceLoss(num_classes=3, embedding_size=2, sample_rate=0.5)
    with pytest.raises(ValueError, match="sample_rate runs only on the library's path"):
        loss(torch.randn(4, 2, dtype=torch.float16), torch.tensor([0, 1, 2, 0]))


def test_numpy_function_samples():
    ctx = wml.Context("cpu")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 500)).astype(np.float32)
    labels = rng.integers(0, 500, 16)
    out = wml.classifier_loss(ctx, x, labels, w, "cosface", sample_rate=0.05, seed=9)
    kept = wml.sampled_classes(500, labels, 0.05, 9)
    assert out.classes_used == len(kept) and set(labels.tolist()) <= set(kept.tolist())
    touched = np.flatnonzero(np.abs(out.weight_grad).sum(axis=0))
    assert set(touched.tolist()) <= set(kept.tolist())
    full = wml.classifier_loss(ctx, x, labels, w, "cosface")
    assert full.classes_used == 500 and full.loss != out.loss


@pytest.mark.parametrize(
    "name,kw,attr",
    [
        ("ArcFaceLoss", {}, "W"),
        ("CosFaceLoss", {}, "W"),
        ("NormalizedSoftmaxLoss", {}, "W"),
        ("ProxyNCALoss", {}, "proxies"),
    ],
)
def test_the_device_path_equals_pml(name, kw, attr, ctx):
    """On each backend (the wgpu one runs these four on the device): PML's values and both
    gradients."""
    classes, d, b = 40, 16, 48
    torch.manual_seed(5)
    theirs = getattr(losses, name)(num_classes=classes, embedding_size=d, **kw)
    ours = getattr(drop, name)(num_classes=classes, embedding_size=d, context=ctx, **kw)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(b, d) * 2
    labels = torch.randint(0, classes, (b,))
    assert_same(run(ours, x, labels, attr), run(theirs, x, labels, attr), f"{name} on {ctx.path}")
