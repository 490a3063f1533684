"""PML's pair losses (ContrastiveLoss, MultiSimilarityLoss, SupConLoss, CircleLoss, NCALoss,
GeneralizedLiftedStructureLoss, MarginLoss) as drop-ins against the real PML and torch's autograd: values and gradients on every distance
the library computes, references and their gradient, the memory bank, PML's edges and the
fallbacks to PML's own code."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pml = pytest.importorskip("pytorch_metric_learning")

from pytorch_metric_learning import distances, losses, miners  # noqa: E402

import wgpu_metric_learning as wml  # noqa: E402
from conftest import BACKENDS  # noqa: E402
from test_losses import DISTANCES, batch, value_and_grads  # noqa: E402
from wgpu_metric_learning import pml as drop  # noqa: E402

torch.set_num_threads(2)

# (drop-in and PML class name, parameter sets, distances PML accepts for it)
LOSSES = {
    "ContrastiveLoss": ([{}, {"pos_margin": 0.2, "neg_margin": 0.8}], list(DISTANCES)),
    "MultiSimilarityLoss": ([{}, {"alpha": 4, "beta": 20, "base": 0.3}], list(DISTANCES)),
    "SupConLoss": ([{}, {"temperature": 0.5}], ["cosine", "lp", "dot_raw"]),
    "CircleLoss": ([{}, {"m": 0.25, "gamma": 16}], ["cosine"]),
    "NCALoss": ([{}, {"softmax_scale": 3}], list(DISTANCES)),
    "GeneralizedLiftedStructureLoss": ([{}, {"pos_margin": 0.1, "neg_margin": 0.8}], list(DISTANCES)),
    "MarginLoss": ([{}, {"margin": 0.1, "beta": 0.8, "nu": 0.1, "learn_beta": True}], list(DISTANCES)),
    "FastAPLoss": ([{}, {"num_bins": 25}], ["lp_squared", "lp"]),
    "LiftedStructureLoss": ([{}, {"pos_margin": 0.1, "neg_margin": 0.8}], list(DISTANCES)),
    "HistogramLoss": ([{}, {"n_bins": 15}, {"delta": 0.04}], ["cosine"]),
    "TupletMarginLoss": ([{}, {"margin": 10, "scale": 16}], ["cosine"]),
    "IntraPairVarianceLoss": ([{}, {"pos_eps": 0.05, "neg_eps": 0.1}], list(DISTANCES)),
    "RankedListLoss": (
        [{"margin": 0.4, "Tn": 1.0}, {"margin": 0.8, "Tn": 3, "Tp": 1, "imbalance": 0.3, "alpha": 1.1}],
        list(DISTANCES),
    ),
    "ThresholdConsistentMarginLoss": (
        [{}, {"lambda_plus": 0.5, "lambda_minus": 2, "margin_plus": 0.3, "margin_minus": -0.2}],
        ["cosine"],
    ),
    "PNPLoss": (
        [{}, {"variant": "Ds", "anneal": 0.05}, {"variant": "Dq", "alpha": 2}, {"variant": "Iu"},
         {"variant": "Ib", "b": 3}],
        ["cosine"],
    ),
    "NPairsLoss": ([{}], ["cosine", "lp", "dot_raw"]),
    "InstanceLoss": ([{}, {"gamma": 3}], ["cosine"]),
    "AngularLoss": ([{}, {"alpha": 30}], ["lp"]),
    "SignalToNoiseRatioContrastiveLoss": ([{}, {"pos_margin": 0.2, "neg_margin": 2.0}], ["snr", "snr_raw"]),
}
# PML's SNRDistance, for SignalToNoiseRatioContrastiveLoss only.
DISTANCES = {
    **DISTANCES,
    "snr": lambda: distances.SNRDistance(),
    "snr_raw": lambda: distances.SNRDistance(normalize_embeddings=False),
}
# Losses whose PML code refuses references (ref_emb, CrossBatchMemory), or (TCM) indexes
# the embeddings with the references' pairs.
NO_REFS = [
    "FastAPLoss", "HistogramLoss", "RankedListLoss", "ThresholdConsistentMarginLoss", "PNPLoss",
    "NPairsLoss", "InstanceLoss",
]
# Losses whose PML code refuses an indices_tuple.
NO_TUPLES = ["RankedListLoss", "PNPLoss", "InstanceLoss"]


def default_dist(name):
    """Cosine where PML accepts it for the loss, else the loss's first distance."""
    dists = LOSSES[name][1]
    return "cosine" if "cosine" in dists else dists[0]
# PML's GenericPairLoss subclasses: no loss with at most one positive and one negative pair.
GENERIC = [
    "ContrastiveLoss", "MultiSimilarityLoss", "SupConLoss", "CircleLoss",
    "GeneralizedLiftedStructureLoss", "LiftedStructureLoss", "TupletMarginLoss",
    "IntraPairVarianceLoss",
]
CASES = [(name, i, dist) for name, (params, dists) in LOSSES.items() for i in range(len(params)) for dist in dists]


def assert_same(ours, theirs, rtol=1e-5):
    """Values within ``rtol`` relative and gradients within 1e-4 of their largest element
    (the issue's bar: PML computes in float32, the library in float64 per anchor, so with
    CircleLoss's γ = 80 single elements differ past an element-wise 1e-4)."""
    (v1, g1), (v2, g2) = ours, theirs
    assert v1.item() == pytest.approx(v2.item(), rel=rtol, abs=1e-6)
    for a, b in zip(g1, g2):
        # An absolute floor of 1e-7: float32 noise where the true gradient is 0 (one class).
        scale = max(b.abs().max().item(), 1e-3)
        assert (a - b).abs().max().item() <= 1e-4 * scale, ((a - b).abs().max(), scale)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def make(name, i, dist, **kw):
    sets = LOSSES[name][0]
    params = sets[min(i, len(sets) - 1)]
    return (
        getattr(drop, name)(distance=DISTANCES[dist](), **params, **kw),
        getattr(losses, name)(distance=DISTANCES[dist](), **params),
    )


@pytest.mark.parametrize("name,i,dist", CASES)
def test_pair_losses_equal_pml(backend, name, i, dist):
    for seed, classes in [(0, 4), (1, 12), (2, 2)]:
        x, y = batch(n=24, seed=seed, classes=classes)
        ours, theirs = make(name, i, dist, backend=backend)
        assert ours._library_can(), "runs in the library"
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))


@pytest.mark.parametrize("name", list(LOSSES))
def test_references_and_their_gradient_equal_pml(backend, name):
    x, y = batch(n=12, seed=1)
    r, ry = batch(n=40, seed=2)
    ours, theirs = make(name, 1, default_dist(name), backend=backend)
    if name in NO_REFS:
        # PML's code runs for references, and fails as PML's does.
        failures = []
        for loss in (ours, theirs):
            with pytest.raises(Exception) as caught:
                loss(x, y, None, r, ry)
            failures.append(caught.type)
        assert failures[0] is failures[1]
        return

    def call(fn):
        return lambda e, rr: fn(e, y, None, rr, ry)

    assert_same(value_and_grads(call(ours), x, r), value_and_grads(call(theirs), x, r))

    # The same tensor in both roles: PML's identity rule drops the diagonal.
    def same(fn):
        return lambda e: fn(e, y, None, e, y)

    assert_same(value_and_grads(same(ours), x), value_and_grads(same(theirs), x))


@pytest.mark.parametrize("name", list(LOSSES))
def test_cross_batch_memory_runs_the_loss_against_the_bank(backend, name):
    if name in NO_REFS:
        return  # PML's CrossBatchMemory hands the loss references, which it refuses
    ours_loss, theirs_loss = make(name, 0, default_dist(name), backend=backend)
    ours = drop.CrossBatchMemory(ours_loss, 6, memory_size=40)
    theirs = losses.CrossBatchMemory(theirs_loss, 6, memory_size=40)
    for step in range(6):  # batches of 12 into 40 slots: wraps
        x, y = batch(n=12, seed=50 + step, classes=5)
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))


@pytest.mark.parametrize("name", list(LOSSES))
def test_pml_edges_one_class_one_pair_all_distinct(backend, name):
    ours, theirs = make(name, 0, default_dist(name), backend=backend)
    x, _ = batch(n=6, seed=3)
    for y in [torch.zeros(6, dtype=torch.long), torch.arange(6), torch.tensor([0, 0, 1, 2, 3, 4])]:
        got, want = value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y)
        if name == "NCALoss" and torch.isnan(want[0]):
            # No anchor with a positive: PML's mean over nothing is NaN; the library's is 0.
            assert got[0].item() == 0.0 and torch.count_nonzero(got[1][0]) == 0
            continue
        assert_same(got, want)
    if name in NO_REFS:
        return
    # One positive and one negative pair: PML returns no loss.
    one = lambda fn: lambda e, rr: fn(e, torch.tensor([0]), None, rr, torch.tensor([0, 1]))  # noqa: E731
    x1, r1 = x[:1], x[1:3]
    out = value_and_grads(one(ours), x1, r1)
    if name in GENERIC or name == "NCALoss":  # NCA: a single query
        assert out[0].item() == 0.0
    assert_same(out, value_and_grads(one(theirs), x1, r1))


def test_fallbacks_run_pmls_code():
    x, y = batch(seed=3)
    # Another reducer, and a miner's indices_tuple: PML's own code.
    for name, (params, _) in LOSSES.items():
        kw = params[0]
        ours = getattr(drop, name)(reducer=pml.reducers.SumReducer(), **kw)
        theirs = getattr(losses, name)(reducer=pml.reducers.SumReducer(), **kw)
        assert not ours._library_can()
        assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))
        pairs = miners.MultiSimilarityMiner()(x, y)
        ours, theirs = getattr(drop, name)(**kw), getattr(losses, name)(**kw)
        if name in NO_TUPLES:
            for loss in (ours, theirs):
                with pytest.raises(ValueError):
                    loss(x, y, pairs)
            continue
        assert ours(x, y, pairs).item() == pytest.approx(theirs(x, y, pairs).item(), rel=1e-6)
    # SNRDistance(p=1) normalises by the L1 norm: PML's code.
    assert not drop.SignalToNoiseRatioContrastiveLoss(distance=distances.SNRDistance(p=1))._library_can()
    # The default reducer's type with other thresholds is not the default.
    assert not drop.ContrastiveLoss(reducer=pml.reducers.AvgNonZeroReducer(high=0.5))._library_can()
    assert drop.ContrastiveLoss(reducer=pml.reducers.AvgNonZeroReducer())._library_can()
    drop._warned.clear()
    with pytest.warns(UserWarning, match="PML's own code"):
        ours = drop.ContrastiveLoss(distance=distances.LpDistance(p=1))
    theirs = losses.ContrastiveLoss(distance=distances.LpDistance(p=1))
    assert_same(value_and_grads(ours, x, labels=y), value_and_grads(theirs, x, labels=y))


def test_numpy_functions():
    ctx = wml.Context(backend="cpu")
    x, y = batch(seed=4)
    xn, yn = x.numpy(), y.numpy()
    out = wml.contrastive_loss(ctx, xn, yn)
    theirs = losses.ContrastiveLoss()(x, y).item()
    assert out.loss == pytest.approx(theirs, rel=1e-5)
    assert out.grad.shape == xn.shape and out.ref_grad is None
    assert out.total == 24 * 23
    r, ry = batch(n=10, seed=5)
    out = wml.supcon_loss(ctx, xn, yn, (r.numpy(), ry.numpy()), ref_grad=True)
    assert out.ref_grad.shape == (10, 6)
    assert wml.multi_similarity_loss(ctx, xn, yn).count == 24
    assert 0 < wml.circle_loss(ctx, xn, yn).count <= 24
    assert wml.nca_loss(ctx, xn, yn).beta_grad is None
    assert wml.generalized_lifted_structure_loss(ctx, xn, yn).count == 24
    fast = wml.fast_ap_loss(ctx, xn, yn, num_bins=20)
    assert fast.loss == pytest.approx(losses.FastAPLoss(num_bins=20)(x, y).item(), rel=1e-5)
    with pytest.raises(ValueError, match="distance"):
        wml.fast_ap_loss(ctx, xn, yn, distance="cosine")
    m = wml.margin_loss(ctx, xn, yn, learn_beta=True, nu=0.1)
    pml_margin = losses.MarginLoss(learn_beta=True, nu=0.1)
    pml_margin(x, y).backward()
    assert m.beta_grad == pytest.approx(pml_margin.beta.grad.item(), rel=1e-4)
    with pytest.raises(ValueError, match="cosine"):
        wml.circle_loss(ctx, xn, yn, distance="euclidean")
    with pytest.raises(ValueError, match="temperature"):
        wml.supcon_loss(ctx, xn, yn, temperature=0.0)
    bank = wml.MemoryBank(ctx, 32, 6)
    bank.enqueue(xn, yn)
    assert np.isfinite(wml.multi_similarity_loss(ctx, xn[:4], yn[:4], bank).loss)


@pytest.mark.parametrize("dist", ["lp", "cosine"])
def test_margin_loss_learns_beta_as_pml(backend, dist):
    x, y = batch(n=24, seed=7)
    r, ry = batch(n=30, seed=8)
    kw = dict(margin=0.1, beta=0.9, nu=0.05, learn_beta=True, distance=DISTANCES[dist]())
    ours, theirs = drop.MarginLoss(backend=backend, **kw), losses.MarginLoss(**kw)
    for call in (lambda f: f(x, y), lambda f: f(x, y, None, r, ry)):
        for loss in (ours, theirs):
            loss.beta.grad = None
        vo, vt = call(ours), call(theirs)
        vo.backward()
        vt.backward()
        assert vo.item() == pytest.approx(vt.item(), rel=1e-5)
        assert ours.beta.grad is not None
        assert ours.beta.grad.item() == pytest.approx(theirs.beta.grad.item(), rel=1e-4, abs=1e-6)
    # One β per class: PML's own code.
    assert not drop.MarginLoss(num_classes=4)._library_can()


def test_nca_leaves_out_only_the_same_tensor(backend):
    x, y = batch(n=12, seed=9)
    ours, theirs = drop.NCALoss(backend=backend), losses.NCALoss()
    # A copy of the batch as references: PML keeps every row's own pair.
    copy = x.clone()
    call = lambda f: lambda e, rr: f(e, y, None, rr, y)  # noqa: E731
    assert_same(value_and_grads(call(ours), x, copy), value_and_grads(call(theirs), x, copy))


# The NumPy functions of the later losses against PML's classes: (function, PML class, args).
FUNCTIONS = [
    ("lifted_structure_loss", "LiftedStructureLoss", {"neg_margin": 0.9}),
    ("histogram_loss", "HistogramLoss", {"n_bins": 20}),
    ("tuplet_margin_loss", "TupletMarginLoss", {"margin": 8.0, "scale": 32.0}),
    ("intra_pair_variance_loss", "IntraPairVarianceLoss", {"pos_eps": 0.05}),
    ("ranked_list_loss", "RankedListLoss", {"margin": 0.5, "tn": 2.0, "tp": 1.0}),
    ("threshold_consistent_margin_loss", "ThresholdConsistentMarginLoss", {"margin_minus": 0.1}),
    ("pnp_loss", "PNPLoss", {"variant": "Ib", "anneal": 0.05}),
    ("n_pairs_loss", "NPairsLoss", {}),
    ("instance_loss", "InstanceLoss", {"gamma": 8.0}),
    ("angular_loss", "AngularLoss", {"alpha": 35.0}),
    ("snr_contrastive_loss", "SignalToNoiseRatioContrastiveLoss", {"neg_margin": 2.0}),
]
PML_NAMES = {"tn": "Tn", "tp": "Tp"}


@pytest.mark.parametrize("fn,cls,kw", FUNCTIONS)
def test_numpy_functions_of_the_later_losses(fn, cls, kw):
    ctx = wml.Context(backend="cpu")
    x, y = batch(seed=11)
    out = getattr(wml, fn)(ctx, x.numpy(), y.numpy(), **kw)
    theirs = getattr(losses, cls)(**{PML_NAMES.get(k, k): v for k, v in kw.items()})
    want, (grad,) = value_and_grads(lambda e: theirs(e, y), x)
    assert out.loss == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    assert np.abs(out.grad - grad.numpy()).max() <= 1e-4 * max(grad.abs().max().item(), 1e-3)
    assert out.total == 24 * 23


def test_bad_arguments_of_the_later_losses_raise():
    ctx = wml.Context(backend="cpu")
    x, y = batch(seed=12)
    xn, yn = x.numpy(), y.numpy()
    r, ry = batch(n=10, seed=13)
    for fn in ("histogram_loss", "pnp_loss", "n_pairs_loss", "instance_loss"):
        with pytest.raises(ValueError, match="refs"):
            getattr(wml, fn)(ctx, xn, yn, (r.numpy(), ry.numpy()))
    with pytest.raises(ValueError, match="variant"):
        wml.pnp_loss(ctx, xn, yn, variant="X")
    with pytest.raises(ValueError, match="imbalance"):
        wml.ranked_list_loss(ctx, xn, yn, imbalance=2.0)
    with pytest.raises(ValueError, match="cosine"):
        wml.tuplet_margin_loss(ctx, xn, yn, distance="euclidean")


def test_drop_ins_run_pmls_code_where_the_library_refuses():
    x, y = batch(seed=14)
    # A delta that does not split [-1, 1] evenly; a scale or anneal the library refuses.
    for name, kw in [
        ("HistogramLoss", {"delta": 0.3}),
        ("TupletMarginLoss", {"scale": 0}),
        ("PNPLoss", {"anneal": 0.0}),
        ("InstanceLoss", {"gamma": 0}),
    ]:
        ours, theirs = getattr(drop, name)(**kw), getattr(losses, name)(**kw)
        assert not ours._library_can(), name
        got, want = ours(x, y), theirs(x, y)
        assert torch.equal(torch.isnan(got), torch.isnan(want)), name
        if not torch.isnan(want):
            assert got.item() == pytest.approx(want.item(), rel=1e-6), name
    # PNP's b is used by Ib only.
    assert drop.PNPLoss(b=0, variant="O")._library_can()
