"""PML's angular, HDC, distance-weighted and uniform-histogram miners: the drop-ins against the
real pytorch-metric-learning. The deterministic two give PML's tuples; the random two are
compared with PML by two-sample chi-square tests over many draws (their numbers come from the
library's seeded generator, not torch's)."""

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pytorch_metric_learning")

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
}


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def batch(n=32, d=8, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def rows(tup):
    return list(zip(*[t.tolist() for t in tup]))


@pytest.mark.parametrize("dist", list(DISTANCES))
@pytest.mark.parametrize("with_refs", [False, True])
@pytest.mark.parametrize("fraction", [0.3, 0.5, 1.0])
def test_hdc_miner_gives_pmls_pairs_in_topk_order(backend, dist, with_refs, fraction):
    x, y = batch(seed=1)
    ours = drop.HDCMiner(filter_percentage=fraction, distance=DISTANCES[dist](), backend=backend)
    theirs = miners.HDCMiner(filter_percentage=fraction, distance=DISTANCES[dist]())
    args = (x, y, *batch(n=20, seed=2)) if with_refs else (x, y)
    got, want = ours(*args), theirs(*args)
    assert all(t.dtype == torch.int64 for t in got)
    # Without references (a, b) and (b, a) tie: torch.topk puts either first.
    same = (lambda r: r) if with_refs else (lambda r: [tuple(sorted(t)) for t in r])
    assert same(rows(got[:2])) == same(rows(want[:2]))
    assert same(rows(got[2:])) == same(rows(want[2:]))


def test_hdc_miner_on_ties_keeps_pmls_values_in_order(backend):
    # Integer points, raw distances: many exact ties, which torch.topk orders as it happens to.
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 3, (24, 2), generator=g).float()
    y = torch.randint(0, 3, (24,), generator=g)
    dist = lambda: distances.LpDistance(normalize_embeddings=False)  # noqa: E731
    got = drop.HDCMiner(filter_percentage=0.3, distance=dist(), backend=backend)(x, y)
    want = miners.HDCMiner(filter_percentage=0.3, distance=dist())(x, y)
    mat = torch.cdist(x, x)
    for side in (slice(0, 2), slice(2, 4)):
        a, b = got[side]
        c, d = want[side]
        assert torch.equal(mat[a, b], mat[c, d])


@pytest.mark.parametrize("angle", [20, 45, 70])
@pytest.mark.parametrize("with_refs", [False, True])
def test_angular_miner_gives_pmls_triplets(backend, angle, with_refs):
    x, y = batch(n=24, d=6, seed=4)
    args = (x, y, *batch(n=16, d=6, seed=5)) if with_refs else (x, y)
    got = drop.AngularMiner(angle=angle, backend=backend)(*args)
    want = miners.AngularMiner(angle=angle)(*args)
    assert len(want[0]) > 0
    assert rows(got) == rows(want)


def two_sample_chi_square(ours: Counter, theirs: Counter):
    """Pearson's statistic for two samples of equal size over the union of their cells."""
    cells = set(ours) | set(theirs)
    stat = sum((ours[c] - theirs[c]) ** 2 / (ours[c] + theirs[c]) for c in cells)
    return stat, max(len(cells) - 1, 0)


def assert_same_distribution(ours: Counter, theirs: Counter, what: str):
    assert sum(ours.values()) == sum(theirs.values()), what
    stat, df = two_sample_chi_square(ours, theirs)
    limit = df + 5 * (2 * df) ** 0.5 + 10
    assert stat < limit, f"{what}: chi-square {stat:.1f} on {df} degrees of freedom"


DRAWS = 300


def test_distance_weighted_miner_draws_with_pmls_distribution(backend):
    g = torch.Generator().manual_seed(6)
    y = torch.randint(0, 4, (16,), generator=g)
    # Clustered: same-label rows near a class centre, so that many negatives lie within 1.4.
    x = torch.randn(4, 8, generator=g)[y] + 0.6 * torch.randn(16, 8, generator=g)
    ours = drop.DistanceWeightedMiner(backend=backend)
    theirs = miners.DistanceWeightedMiner()
    counts = {k: Counter() for k in ("ours_n", "theirs_n", "ours_p", "theirs_p")}
    for i in range(DRAWS):
        torch.manual_seed(i)
        a, p, n = ours(x, y)
        b, q, m = theirs(x, y)
        # The same number of triplets for each anchor, every draw.
        assert Counter(a.tolist()) == Counter(b.tolist())
        counts["ours_n"].update(zip(a.tolist(), n.tolist()))
        counts["theirs_n"].update(zip(b.tolist(), m.tolist()))
        counts["ours_p"].update(zip(a.tolist(), p.tolist()))
        counts["theirs_p"].update(zip(b.tolist(), q.tolist()))
    assert len(counts["theirs_n"]) > 20
    assert_same_distribution(counts["ours_n"], counts["theirs_n"], "negatives")
    assert_same_distribution(counts["ours_p"], counts["theirs_p"], "positives")


@pytest.mark.parametrize("dist", ["lp", "cosine"])
def test_uniform_histogram_miner_draws_with_pmls_distribution(backend, dist):
    x, y = batch(n=16, d=4, classes=3, seed=7)
    kw = dict(num_bins=6, pos_per_bin=3, neg_per_bin=4)
    ours = drop.UniformHistogramMiner(distance=DISTANCES[dist](), backend=backend, **kw)
    theirs = miners.UniformHistogramMiner(distance=DISTANCES[dist](), **kw)
    counts = {k: Counter() for k in ("op", "tp", "on", "tn")}
    for i in range(DRAWS):
        torch.manual_seed(i)
        got, want = ours(x, y), theirs(x, y)
        assert [len(t) for t in got] == [len(t) for t in want]
        counts["op"].update(rows(got[:2]))
        counts["tp"].update(rows(want[:2]))
        counts["on"].update(rows(got[2:]))
        counts["tn"].update(rows(want[2:]))
    assert_same_distribution(counts["op"], counts["tp"], "positives")
    assert_same_distribution(counts["on"], counts["tn"], "negatives")


def test_random_miners_repeat_with_a_seed_and_under_torch_manual_seed():
    x, y = batch(seed=8)
    for cls in (drop.DistanceWeightedMiner, drop.UniformHistogramMiner):
        fixed = cls(seed=5, backend="cpu")
        assert rows(fixed(x, y)) == rows(fixed(x, y))
        free = cls(backend="cpu")
        torch.manual_seed(0)
        first = rows(free(x, y))
        torch.manual_seed(0)
        assert rows(free(x, y)) == first
        assert rows(free(x, y)) != first


def test_the_functions_match_the_drop_ins():
    ctx = wml.Context(backend="cpu")
    x, y = batch(seed=9)
    xs, ys = x.numpy(), y.numpy()
    t = wml.angular_triplets(ctx, xs, ys, angle=30.0)
    assert t.dtype == np.uint32 and t.shape[1] == 3
    assert [tuple(r) for r in t.tolist()] == rows(drop.AngularMiner(angle=30, backend="cpu")(x, y))
    p = wml.hdc_pairs(ctx, xs, ys, filter_percentage=0.2)
    want = drop.HDCMiner(filter_percentage=0.2, backend="cpu")(x, y)
    assert [tuple(r) for r in p.positives.tolist()] == rows(want[:2])
    d = wml.distance_weighted_triplets(ctx, xs, ys, seed=3)
    assert np.array_equal(d, wml.distance_weighted_triplets(ctx, xs, ys, seed=3))
    u = wml.uniform_histogram_pairs(ctx, xs, ys, num_bins=5, pos_per_bin=2, neg_per_bin=2, seed=3)
    assert u.positives.shape[1] == 2 and len(u.positives) % 2 == 0


def test_bad_settings_raise():
    ctx = wml.Context(backend="cpu")
    x, y = batch(seed=10)
    with pytest.raises(ValueError, match="filter_percentage"):
        drop.HDCMiner(filter_percentage=1.5, backend="cpu")(x, y)
    with pytest.raises(ValueError, match="num_bins"):
        wml.uniform_histogram_pairs(ctx, x.numpy(), y.numpy(), num_bins=0)
    # PML accepts only LpDistance(p=2, power=1, normalised) for these two.
    with pytest.raises(AssertionError):
        drop.AngularMiner(distance=distances.CosineSimilarity())
    with pytest.raises(AssertionError):
        drop.DistanceWeightedMiner(distance=distances.LpDistance(power=2))


@pytest.mark.parametrize("name", ["HDCMiner", "AngularMiner"])
def test_deterministic_miners_in_cross_batch_memory_give_pmls_losses(backend, name):
    # Our memory with our miner against PML's memory with PML's miner, step by step. The
    # losses depend on the mined pairs' values only (HDC's tied pairs (i, slot j) and
    # (j, slot i) may be picked either way), so they must agree.
    loss_fn = losses.ContrastiveLoss if name == "HDCMiner" else losses.TripletMarginLoss
    ours = drop.CrossBatchMemory(loss_fn(), 8, memory_size=40, miner=getattr(drop, name)(backend=backend))
    theirs = losses.CrossBatchMemory(loss_fn(), 8, memory_size=40, miner=getattr(miners, name)())
    for step in range(6):  # batches of 12 into 40 slots: wraps
        x, y = batch(n=12, classes=3, seed=40 + step)
        a, b = ours(x, y), theirs(x, y)
        assert a.item() == pytest.approx(b.item(), rel=1e-5, abs=1e-6), step


@pytest.mark.parametrize("cls", [drop.HDCMiner, drop.DistanceWeightedMiner, drop.UniformHistogramMiner, drop.AngularMiner])
def test_the_new_miners_inside_cross_batch_memory(backend, cls):
    # Ours and PML's memory: the miner sees the memory as references; the loss is finite and
    # every mined index is a valid slot.
    for memory in (
        drop.CrossBatchMemory(losses.ContrastiveLoss(), 8, memory_size=40, miner=cls(backend=backend)),
        losses.CrossBatchMemory(losses.ContrastiveLoss(), 8, memory_size=40, miner=cls(backend=backend)),
    ):
        for step in range(4):
            x, y = batch(n=12, classes=3, seed=20 + step)
            loss = memory(x.requires_grad_(True), y)
            assert torch.isfinite(loss)


def test_the_new_miners_on_edge_inputs(backend):
    g = torch.Generator().manual_seed(11)
    one_class = (torch.randn(6, 4, generator=g), torch.zeros(6, dtype=torch.long))
    unique = (torch.randn(6, 4, generator=g), torch.arange(6))
    empty = (torch.randn(0, 4), torch.zeros(0, dtype=torch.long))
    for name, exact in [("HDCMiner", True), ("AngularMiner", True), ("DistanceWeightedMiner", False),
                        ("UniformHistogramMiner", False)]:
        for x, y in (one_class, unique):
            torch.manual_seed(0)
            ours = getattr(drop, name)(backend=backend)(x, y)
            theirs = getattr(miners, name)()(x, y)
            assert all(t.dtype == torch.int64 for t in ours)
            assert [len(t) for t in ours] == [len(t) for t in theirs], name
            if exact:
                assert rows(ours) == rows(theirs), name
        ours = getattr(drop, name)(backend=backend)(*empty)
        assert all(len(t) == 0 for t in ours), name
