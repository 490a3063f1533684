"""The losses (TripletMarginLoss, NTXentLoss, MultipleNegativesRankingLoss) against the real
PML and torch's autograd: values and gradients, fused miners, references, the memory bank."""

import importlib.util
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pml = pytest.importorskip("pytorch_metric_learning")

from pytorch_metric_learning import distances, losses, miners  # noqa: E402

import wgpu_metric_learning as wml  # noqa: E402
from conftest import BACKENDS  # noqa: E402
from wgpu_metric_learning import pml as drop  # noqa: E402

torch.set_num_threads(2)

DISTANCES = {
    "lp": lambda: distances.LpDistance(),
    "lp_raw": lambda: distances.LpDistance(normalize_embeddings=False),
    "lp_squared": lambda: distances.LpDistance(power=2),
    "cosine": lambda: distances.CosineSimilarity(),
    "dot_raw": lambda: distances.DotProductSimilarity(normalize_embeddings=False),
}


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def batch(n=24, d=6, classes=4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
    return x.float(), torch.randint(0, classes, (n,), generator=g)


def value_and_grads(loss_fn, *tensors, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    value = loss_fn(*leaves, **kw)
    grads = torch.autograd.grad(value, leaves, allow_unused=True) if value.requires_grad else [None] * len(leaves)
    return value.detach(), [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def assert_same(ours, theirs, rtol=1e-4, atol=1e-5):
    (v1, g1), (v2, g2) = ours, theirs
    assert v1.item() == pytest.approx(v2.item(), rel=rtol, abs=atol)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=rtol, atol=atol), (a - b).abs().max()


@pytest.mark.parametrize("dist", list(DISTANCES))
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("margin", [0.05, 0.5])
def test_triplet_margin_loss_equals_pml(backend, dist, smooth, margin):
    for seed in range(3):
        x, y = batch(seed=seed)
        ours = drop.TripletMarginLoss(margin=margin, smooth_loss=smooth, distance=DISTANCES[dist](), backend=backend)
        theirs = losses.TripletMarginLoss(margin=margin, smooth_loss=smooth, distance=DISTANCES[dist]())
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))


@pytest.mark.parametrize("dist", list(DISTANCES))
@pytest.mark.parametrize("smooth", [False, True])
def test_swap_equals_pml(backend, dist, smooth):
    make = lambda cls, **kw: cls(margin=0.2, swap=True, smooth_loss=smooth, distance=DISTANCES[dist](), **kw)  # noqa: E731
    for seed in range(3):
        x, y = batch(seed=seed, classes=3)
        ours, theirs = make(drop.TripletMarginLoss, backend=backend), make(losses.TripletMarginLoss)
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))
    # Fused with a miner, which still chooses by d(a, n).
    miner = drop.TripletMarginMiner(
        margin=0.3, type_of_triplets="semihard", distance=DISTANCES[dist](), backend=backend
    )
    ours = make(drop.TripletMarginLoss, miner=miner)
    assert ours._rule_with(miner) is not False, "fused"
    pml_miner = miners.TripletMarginMiner(margin=0.3, type_of_triplets="semihard", distance=DISTANCES[dist]())
    theirs = make(losses.TripletMarginLoss)
    x, y = batch(n=30, seed=5)
    assert_same(
        value_and_grads(ours, x, labels=y),
        value_and_grads(lambda e, labels: theirs(e, labels, pml_miner(e, labels)), x, labels=y),
    )
    # With references PML reads d(p, n) from its embeddings-by-references matrix (its #748):
    # its own code runs, so the drop-in is PML (10 references, so that its rows exist).
    x, y = batch(n=12, seed=1)
    r, ry = batch(n=10, seed=2)

    def call(fn):
        return lambda e, rr: fn(e, y, None, rr, ry)

    ours, theirs = make(drop.TripletMarginLoss, backend=backend), make(losses.TripletMarginLoss)
    assert_same(value_and_grads(call(ours), x, r), value_and_grads(call(theirs), x, r))


@pytest.mark.parametrize("kind", ["all", "hard", "semihard", "easy"])
def test_a_fused_miner_equals_pml_miner_then_loss(backend, kind):
    x, y = batch(n=30, seed=5)
    ours = drop.TripletMarginLoss(
        margin=0.1, miner=drop.TripletMarginMiner(margin=0.3, type_of_triplets=kind, backend=backend)
    )
    pml_miner = miners.TripletMarginMiner(margin=0.3, type_of_triplets=kind)
    theirs = losses.TripletMarginLoss(margin=0.1)
    assert_same(
        value_and_grads(ours, x, labels=y),
        value_and_grads(lambda e, labels: theirs(e, labels, pml_miner(e, labels)), x, labels=y),
    )
    assert ours.miner.num_triplets == pml_miner.num_triplets  # recorded as PML's miner does


def test_the_same_tensor_in_both_roles_equals_pml(backend):
    x, y = batch(n=16, seed=6)
    for loss_cls, kw in [(drop.TripletMarginLoss, {"margin": 0.2}), (drop.NTXentLoss, {})]:
        ours = loss_cls(backend=backend, **kw)
        theirs = getattr(losses, loss_cls.__name__)(**kw)

        def call(fn):
            return lambda e: fn(e, y, None, e, y)

        assert_same(value_and_grads(call(ours), x), value_and_grads(call(theirs), x))


def test_references_and_their_gradient_equal_pml(backend):
    x, y = batch(n=12, seed=1)
    r, ry = batch(n=40, seed=2)
    for loss_cls, kw in [(drop.TripletMarginLoss, {"margin": 0.2}), (drop.NTXentLoss, {"temperature": 0.1})]:
        ours = loss_cls(backend=backend, **kw)
        theirs = getattr(losses, loss_cls.__name__)(**kw)

        def call(fn):
            return lambda e, rr: fn(e, y, None, rr, ry)

        assert_same(value_and_grads(call(ours), x, r), value_and_grads(call(theirs), x, r))


def test_hinge_ties_all_easy_and_no_triplets_give_zero(backend):
    # Row 0: d(a, p) = 1, d(a, n) = 2 (squared 4), exact in PML's cdist and here alike, so at
    # margin 1 (3 squared) its violation is exactly 0: no loss, not averaged, no gradient.
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    for power, margin in [(1, 1.0), (2, 3.0)]:
        dist = lambda: distances.LpDistance(normalize_embeddings=False, power=power)  # noqa: E731
        ours = drop.TripletMarginLoss(margin=margin, distance=dist(), backend=backend)
        theirs = losses.TripletMarginLoss(margin=margin, distance=dist())
        out = value_and_grads(ours, x, labels=y)
        assert_same(out, value_and_grads(theirs, x, labels=y))
        assert out[0].item() == margin  # the other triplet's violation alone
    easy = torch.tensor([[1.0, 0.0], [0.99, 0.01], [-1.0, 0.0], [-0.99, -0.01]])
    v, (g,) = value_and_grads(drop.TripletMarginLoss(backend=backend), easy, labels=torch.tensor([0, 0, 1, 1]))
    assert v.item() == 0.0 and torch.count_nonzero(g) == 0
    v, (g,) = value_and_grads(drop.TripletMarginLoss(backend=backend), easy, labels=torch.zeros(4, dtype=torch.long))
    assert v.item() == 0.0 and torch.count_nonzero(g) == 0


@pytest.mark.parametrize("dist", ["cosine", "lp", "dot_raw"])
@pytest.mark.parametrize("temperature", [0.07, 0.5])
def test_ntxent_equals_pml(backend, dist, temperature):
    for seed, classes in [(0, 4), (1, 12), (2, 2)]:
        x, y = batch(n=24, seed=seed, classes=classes)
        ours = drop.NTXentLoss(temperature=temperature, distance=DISTANCES[dist](), backend=backend)
        theirs = losses.NTXentLoss(temperature=temperature, distance=DISTANCES[dist]())
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))


def test_fallbacks_run_pmls_code():
    x, y = batch(seed=3)
    for ours, theirs in [
        (drop.TripletMarginLoss(reducer=pml.reducers.MeanReducer()),
         losses.TripletMarginLoss(reducer=pml.reducers.MeanReducer())),
        (drop.NTXentLoss(reducer=pml.reducers.SumReducer()), losses.NTXentLoss(reducer=pml.reducers.SumReducer())),
    ]:
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y), rtol=1e-6)
    triplets = miners.TripletMarginMiner()(x, y)
    assert drop.TripletMarginLoss()(x, y, triplets).item() == pytest.approx(
        losses.TripletMarginLoss()(x, y, triplets).item(), rel=1e-6
    )
    # A distance without a kernel: PML's own code, the same value and gradients.
    drop._warned.clear()  # the warning comes once per process and class
    with pytest.warns(UserWarning, match="PML's own code"):
        ours = drop.NTXentLoss(distance=distances.LpDistance(p=1))
    theirs = losses.NTXentLoss(distance=distances.LpDistance(p=1))
    assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))


@pytest.mark.parametrize("loss_name", ["triplet", "ntxent"])
def test_cross_batch_memory_runs_the_loss_against_the_bank(backend, loss_name):
    make = {
        "triplet": (lambda: drop.TripletMarginLoss(margin=0.1, backend=backend),
                    lambda: losses.TripletMarginLoss(margin=0.1)),
        "ntxent": (lambda: drop.NTXentLoss(temperature=0.1, backend=backend),
                   lambda: losses.NTXentLoss(temperature=0.1)),
    }[loss_name]
    ours = drop.CrossBatchMemory(make[0](), 6, memory_size=40)
    theirs = losses.CrossBatchMemory(make[1](), 6, memory_size=40)
    for step in range(7):  # batches of 12 into 40 slots: wraps
        x, y = batch(n=12, seed=50 + step, classes=5)
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))
        assert torch.equal(ours.embedding_memory, theirs.embedding_memory)
    # With a fused miner, and with an enqueue mask.
    ours = drop.CrossBatchMemory(drop.TripletMarginLoss(backend=backend), 6, memory_size=40,
                                 miner=drop.TripletMarginMiner(type_of_triplets="semihard", backend=backend))
    theirs = losses.CrossBatchMemory(losses.TripletMarginLoss(), 6, memory_size=40,
                                     miner=miners.TripletMarginMiner(type_of_triplets="semihard"))
    for step in range(5):
        x, y = batch(n=12, seed=70 + step, classes=3)
        mask = torch.arange(12) % 3 == 0
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))
        assert_same(value_and_grads(ours, x, labels=y, enqueue_mask=mask),
                    value_and_grads(theirs, x, labels=y, enqueue_mask=mask))


def mnrl_torch(anchors, candidates, scale=20.0):
    a = torch.nn.functional.normalize(anchors, dim=1)
    c = torch.nn.functional.normalize(candidates, dim=1)
    scores = a @ c.T * scale
    return torch.nn.functional.cross_entropy(scores, torch.arange(len(anchors)))


@pytest.mark.parametrize("scale", [20.0, 1.0])
def test_mnrl_equals_the_full_matrix_version(backend, scale):
    a, _ = batch(n=32, d=16, seed=8)
    c, _ = batch(n=32 + 20, d=16, seed=9)
    ours = drop.MultipleNegativesRankingLoss(scale=scale, backend=backend)
    assert_same(value_and_grads(ours, a, c), value_and_grads(lambda x, z: mnrl_torch(x, z, scale), a, c))
    out = wml.multiple_negatives_ranking_loss(ours.context, a.numpy(), c.numpy(), scale=scale)
    assert (out.count, out.total) == (32, 32 * 51)
    with pytest.raises(ValueError):
        wml.multiple_negatives_ranking_loss(wml.Context(backend="cpu"), c.numpy(), a.numpy())
    # One anchor and two candidates: a cross-entropy over two logits, not PML's "no loss".
    one = value_and_grads(ours, a[:1], c[:2])
    assert one[0].item() > 0
    assert_same(one, value_and_grads(lambda x, z: mnrl_torch(x, z, scale), a[:1], c[:2]))


def test_numpy_functions_and_bad_inputs():
    ctx = wml.Context(backend="cpu")
    x, y = batch(seed=4)
    out = wml.triplet_margin_loss(ctx, x.numpy(), y.numpy(), margin=0.3)
    assert out.grad.shape == (24, 6) and out.grad.dtype == np.float32 and out.ref_grad is None
    assert 0 < out.count <= out.total
    with pytest.raises(ValueError, match="margin"):
        wml.triplet_margin_loss(ctx, x.numpy(), y.numpy(), margin=float("nan"))
    with pytest.raises(ValueError, match="temperature"):
        wml.ntxent_loss(ctx, x.numpy(), y.numpy(), temperature=0.0)
    with pytest.raises(MemoryError):
        wml.ntxent_loss(wml.Context(backend="cpu", budget=1000), x.numpy(), y.numpy())


def test_gradcache_example_matches_the_full_batch_step():
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "gradcache.py"
    spec = importlib.util.spec_from_file_location("gradcache", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    cached, full = example.compare(batch=64, mini_batch=16, seed=0)
    assert cached["loss"] == pytest.approx(full["loss"], rel=1e-5)
    for name in full["grads"]:
        assert torch.allclose(cached["grads"][name], full["grads"][name], rtol=1e-4, atol=1e-6), name
