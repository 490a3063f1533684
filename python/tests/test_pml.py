"""The drop-ins in wgpu_metric_learning.pml against the real pytorch-metric-learning."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pml = pytest.importorskip("pytorch_metric_learning")

from pytorch_metric_learning import distances, losses, miners  # noqa: E402
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator  # noqa: E402
from pytorch_metric_learning.utils.inference import CustomKNN  # noqa: E402

import wgpu_metric_learning as wml  # noqa: E402
from conftest import BACKENDS  # noqa: E402
from wgpu_metric_learning import pml as drop  # noqa: E402

torch.set_num_threads(2)

DISTANCES = {
    "lp": lambda: distances.LpDistance(),
    "lp_raw": lambda: distances.LpDistance(normalize_embeddings=False),
    "lp_squared": lambda: distances.LpDistance(power=2),
    "lp_raw_squared": lambda: distances.LpDistance(normalize_embeddings=False, power=2),
    "cosine": lambda: distances.CosineSimilarity(),
    "dot_raw": lambda: distances.DotProductSimilarity(normalize_embeddings=False),
}
# Exact ties: small integer coordinates, raw (unnormalised) Lp distances, whose equal true
# values are equal floats in PML and here alike.
TIE_DISTANCES = ["lp_raw", "lp_raw_squared"]


def random_batch(n=32, d=8, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def tie_batch(n=32, d=3, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (n, d), generator=g).float()
    x[x.abs().sum(1) == 0, 0] = 1.0  # no zero rows
    return x, torch.randint(0, classes, (n,), generator=g)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def assert_same_tuple(ours, theirs, as_sets=False):
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        assert o.dtype == torch.int64 and o.device == t.device
    if as_sets:
        rows = lambda tup: sorted(zip(*[x.tolist() for x in tup]))  # noqa: E731
        if len(ours) == 4:
            assert rows(ours[:2]) == rows(theirs[:2]) and rows(ours[2:]) == rows(theirs[2:])
        else:
            assert rows(ours) == rows(theirs)
    else:
        for o, t in zip(ours, theirs):
            assert torch.equal(o, t), (o, t)


def both(ours_cls, theirs_cls, dist, backend, **kw):
    return (
        ours_cls(distance=DISTANCES[dist](), backend=backend, **kw),
        theirs_cls(distance=DISTANCES[dist](), **kw),
    )


@pytest.mark.parametrize("dist", list(DISTANCES))
@pytest.mark.parametrize("kind", ["all", "hard", "semihard", "easy"])
def test_triplet_margin_miner(backend, dist, kind):
    for seed, margin in [(0, 0.2), (1, 0.0), (2, 0.5), (3, -0.1)]:
        x, y = random_batch(seed=seed)
        ours, theirs = both(drop.TripletMarginMiner, miners.TripletMarginMiner, dist, backend,
                            margin=margin, type_of_triplets=kind)
        assert_same_tuple(ours(x, y), theirs(x, y))
        # Separate references, and the same tensors passed as references (PML's identity rule).
        rx, ry = random_batch(n=40, seed=seed + 10)
        assert_same_tuple(ours(x, y, rx, ry), theirs(x, y, rx, ry))
        assert_same_tuple(ours(x, y, x, y), theirs(x, y, x, y))
        assert_same_tuple(ours(x, y, x, y.clone()), theirs(x, y, x, y.clone()))
        assert_same_tuple(ours(x, y, x.clone(), y), theirs(x, y, x.clone(), y))


@pytest.mark.parametrize("dist", TIE_DISTANCES)
@pytest.mark.parametrize("kind", ["all", "hard", "semihard", "easy"])
def test_triplet_margin_miner_ties(backend, dist, kind):
    x, y = tie_batch()
    for margin in (0.0, 0.3):
        ours, theirs = both(drop.TripletMarginMiner, miners.TripletMarginMiner, dist, backend,
                            margin=margin, type_of_triplets=kind)
        assert_same_tuple(ours(x, y), theirs(x, y))


@pytest.mark.parametrize("dist", list(DISTANCES))
def test_batch_hard_miner(backend, dist):
    for seed in range(3):
        x, y = random_batch(seed=seed)
        ours, theirs = both(drop.BatchHardMiner, miners.BatchHardMiner, dist, backend)
        assert_same_tuple(ours(x, y), theirs(x, y))
        rx, ry = random_batch(n=40, seed=seed + 10)
        assert_same_tuple(ours(x, y, rx, ry), theirs(x, y, rx, ry))


STRATEGIES = [(p, n) for p in ["hard", "semihard", "easy", "all"] for n in ["hard", "semihard", "easy", "all"]
              if not (p == n == "semihard") and not ({p, n} == {"semihard", "all"})]


@pytest.mark.parametrize("dist", ["lp", "lp_raw_squared", "cosine"])
@pytest.mark.parametrize("pos,neg", STRATEGIES)
def test_batch_easy_hard_miner(backend, dist, pos, neg):
    for seed in range(2):
        x, y = random_batch(seed=seed)
        ours, theirs = both(drop.BatchEasyHardMiner, miners.BatchEasyHardMiner, dist, backend,
                            pos_strategy=pos, neg_strategy=neg)
        assert_same_tuple(ours(x, y), theirs(x, y))
    # Allowed ranges (inclusive), on the raw integer grid's tied distances. The bounds lie
    # between the grid's values: PML's squared distances come from cdist's square roots
    # squared (6 is 6.0000005 there), so a bound on a grid value would test that rounding.
    x, y = tie_batch()
    ours, theirs = both(drop.BatchEasyHardMiner, miners.BatchEasyHardMiner, "lp_raw_squared", backend,
                        pos_strategy=pos, neg_strategy=neg, allowed_pos_range=(1.5, 5.5),
                        allowed_neg_range=(0.5, 6.5))
    assert_same_tuple(ours(x, y), theirs(x, y))


@pytest.mark.parametrize("dist", TIE_DISTANCES)
def test_batch_hard_and_easy_hard_ties(backend, dist):
    x, y = tie_batch()
    ours, theirs = both(drop.BatchHardMiner, miners.BatchHardMiner, dist, backend)
    assert_same_tuple(ours(x, y), theirs(x, y))
    ours, theirs = both(drop.BatchEasyHardMiner, miners.BatchEasyHardMiner, dist, backend,
                        pos_strategy="hard", neg_strategy="easy")
    assert_same_tuple(ours(x, y), theirs(x, y))


@pytest.mark.parametrize("dist", list(DISTANCES))
def test_multi_similarity_miner(backend, dist):
    for seed, eps in [(0, 0.1), (1, 0.0), (2, 0.5)]:
        x, y = random_batch(seed=seed)
        ours, theirs = both(drop.MultiSimilarityMiner, miners.MultiSimilarityMiner, dist, backend,
                            epsilon=eps)
        assert_same_tuple(ours(x, y), theirs(x, y))
        rx, ry = random_batch(n=40, seed=seed + 10)
        assert_same_tuple(ours(x, y, rx, ry), theirs(x, y, rx, ry))
    # Default distance: cosine, as PML's.
    assert type(drop.MultiSimilarityMiner().distance) is distances.CosineSimilarity


@pytest.mark.parametrize("dist", TIE_DISTANCES)
def test_multi_similarity_miner_ties(backend, dist):
    # torch.sort is not stable: within an anchor, tied values may come in any order in PML.
    x, y = tie_batch()
    ours, theirs = both(drop.MultiSimilarityMiner, miners.MultiSimilarityMiner, dist, backend)
    assert_same_tuple(ours(x, y), theirs(x, y), as_sets=True)


@pytest.mark.parametrize("dist", list(DISTANCES))
def test_pair_margin_miner(backend, dist):
    for seed, (pm, nm) in [(0, (0.2, 0.8)), (1, (0.5, 1.0)), (2, (-0.5, 0.3))]:
        x, y = random_batch(seed=seed)
        ours, theirs = both(drop.PairMarginMiner, miners.PairMarginMiner, dist, backend,
                            pos_margin=pm, neg_margin=nm)
        assert_same_tuple(ours(x, y), theirs(x, y))
        rx, ry = random_batch(n=40, seed=seed + 10)
        assert_same_tuple(ours(x, y, rx, ry), theirs(x, y, rx, ry))


def test_miners_on_edge_inputs(backend):
    one_class = (torch.randn(6, 4), torch.zeros(6, dtype=torch.long))
    unique = (torch.randn(6, 4), torch.arange(6))
    empty = (torch.randn(0, 4), torch.zeros(0, dtype=torch.long))
    for ours_cls, theirs_cls in [
        (drop.TripletMarginMiner, miners.TripletMarginMiner),
        (drop.BatchHardMiner, miners.BatchHardMiner),
        (drop.PairMarginMiner, miners.PairMarginMiner),
        (drop.MultiSimilarityMiner, miners.MultiSimilarityMiner),
        (drop.BatchEasyHardMiner, miners.BatchEasyHardMiner),
    ]:
        for x, y in (one_class, unique):
            ours = ours_cls(backend=backend)(x, y)
            theirs = theirs_cls()(x, y)
            assert [len(t) for t in ours] == [len(t) for t in theirs]
            assert_same_tuple(ours, theirs)
        ours = ours_cls(backend=backend)(*empty)
        assert all(len(t) == 0 for t in ours)


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        drop.TripletMarginMiner(type_of_triplets="medium")
    with pytest.raises(ValueError):
        drop.BatchEasyHardMiner(pos_strategy="semihard", neg_strategy="all")
    with pytest.raises(ValueError):  # NaN embeddings
        drop.TripletMarginMiner()(torch.full((4, 2), float("nan")), torch.tensor([0, 0, 1, 1]))
    with pytest.raises(TypeError):  # float labels
        drop.BatchHardMiner()(torch.randn(4, 2), torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_other_distances_run_pmls_own_code_with_one_warning():
    """Distances without a kernel (SNR, other p or power, a user's own) run PML's code: the
    same tuples and losses as PML's classes, and one warning per class and distance."""

    class Halved(distances.LpDistance):  # a user's own distance
        def compute_mat(self, query_emb, ref_emb):
            return super().compute_mat(query_emb, ref_emb) / 2

    x, y = torch.randn(24, 5, generator=torch.Generator().manual_seed(3)), torch.arange(24) % 4
    drop._warned.clear()
    cases = [
        (drop.TripletMarginMiner, miners.TripletMarginMiner, distances.SNRDistance(), {}),
        (drop.BatchEasyHardMiner, miners.BatchEasyHardMiner, distances.SNRDistance(), {}),
        (drop.PairMarginMiner, miners.PairMarginMiner, distances.LpDistance(p=1), {}),
        (drop.MultiSimilarityMiner, miners.MultiSimilarityMiner, Halved(), {}),
        (drop.HDCMiner, miners.HDCMiner, distances.LpDistance(power=3), {}),
        (drop.UniformHistogramMiner, miners.UniformHistogramMiner, distances.LpDistance(p=1),
         {"num_bins": 5}),
    ]
    for ours_cls, theirs_cls, distance, kw in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = ours_cls(distance=distance, **kw)
            torch.manual_seed(0)
            got = ours(x, y)
            got_again = ours(x, y)
        named = [w for w in caught if type(distance).__name__ in str(w.message)]
        assert len(named) == 1, (ours_cls.__name__, [str(w.message) for w in caught])
        assert "PML's own code" in str(named[0].message)
        torch.manual_seed(0)
        theirs = theirs_cls(distance=distance, **kw)
        assert_same_tuple(got, theirs(x, y))
        assert_same_tuple(got_again, theirs(x, y))
    knn = drop.KNN(distance=distances.LpDistance(p=1))
    want = CustomKNN(distances.LpDistance(p=1))(x, 3, x, True)
    got = knn(x, 3, x, True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    loss = drop.TripletMarginLoss(distance=distances.SNRDistance())
    want = losses.TripletMarginLoss(distance=distances.SNRDistance())(x, y)
    assert torch.equal(loss(x, y), want)


def clustered(n, d, classes, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, d, generator=g) * 2
    y = torch.randint(0, classes, (n,), generator=g)
    return centres[y] + torch.randn(n, d, generator=g), y


KNN_METRICS = ("precision_at_1", "r_precision", "mean_average_precision_at_r",
               "mean_average_precision", "mean_reciprocal_rank")


@pytest.mark.parametrize("k", [None, "max_bin_count", 5])
def test_accuracy_calculator_with_knn_equals_the_default(backend, k):
    x, y = clustered(1500, 16, 20, seed=1)
    qx, qy = clustered(300, 16, 20, seed=2)
    ours = AccuracyCalculator(include=KNN_METRICS, k=k, knn_func=drop.KNN(backend=backend))
    theirs = AccuracyCalculator(include=KNN_METRICS, k=k)
    for args in [(x, y), (qx, qy, x, y)]:
        a, b = ours.get_accuracy(*args), theirs.get_accuracy(*args)
        for m in KNN_METRICS:
            assert a[m] == pytest.approx(b[m], rel=1e-6), m
        # And the library's own accuracy, all in Rust, on the same arrays.
        ctx = drop.KNN(backend=backend).context
        refs = None if len(args) == 2 else (args[2].numpy(), args[3].numpy())
        got = wml.accuracy(ctx, args[0].numpy(), args[1].numpy(), refs, k=k).metrics
        for m in KNN_METRICS:
            assert got[m] == pytest.approx(b[m], rel=1e-6), m


@pytest.mark.parametrize("dist", ["lp", "lp_raw_squared", "cosine", "dot_raw"])
def test_knn_equals_custom_knn(backend, dist):
    x, _ = clustered(400, 8, 5, seed=3)
    q = x[:100]
    for ref_includes_query in (True, False):
        ours = drop.KNN(distance=DISTANCES[dist](), backend=backend)(q, 7, x, ref_includes_query)
        theirs = CustomKNN(DISTANCES[dist]())(q, 7, x, ref_includes_query)
        assert ours[1].dtype == torch.int64
        assert torch.equal(ours[1], theirs[1])
        # Near zero, a Euclidean distance is the square root of a rounding error (either side).
        assert torch.allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-3)


def cbm_pair(memory_size, miner_pair, loss_fn, backend):
    ours_miner, theirs_miner = miner_pair if miner_pair else (None, None)
    return (
        drop.CrossBatchMemory(loss_fn(), 8, memory_size=memory_size, miner=ours_miner, backend=backend),
        losses.CrossBatchMemory(loss_fn(), 8, memory_size=memory_size, miner=theirs_miner),
    )


@pytest.mark.parametrize(
    "case", ["triplet_margin_miner", "batch_hard", "batch_easy_hard", "multi_similarity", "all_pairs"]
)
# 16 classes in batches of 12: many rows whose only positive in the memory is their own slot,
# where the miners that pick per anchor differ unless mined as PML mines.
@pytest.mark.parametrize("classes", [5, 16])
def test_cross_batch_memory_gives_pml_losses_step_by_step(backend, case, classes):
    setups = {
        "triplet_margin_miner": (
            lambda: (drop.TripletMarginMiner(margin=0.2, type_of_triplets="semihard", backend=backend),
                     miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")),
            lambda: losses.TripletMarginLoss(margin=0.1),
        ),
        "batch_hard": (
            lambda: (drop.BatchHardMiner(backend=backend), miners.BatchHardMiner()),
            lambda: losses.TripletMarginLoss(margin=0.1),
        ),
        "batch_easy_hard": (
            lambda: (drop.BatchEasyHardMiner(backend=backend), miners.BatchEasyHardMiner()),
            lambda: losses.ContrastiveLoss(),
        ),
        "multi_similarity": (
            lambda: (drop.MultiSimilarityMiner(backend=backend), miners.MultiSimilarityMiner()),
            lambda: losses.MultiSimilarityLoss(),
        ),
        "all_pairs": (lambda: None, lambda: losses.ContrastiveLoss()),
    }
    miner_pair, loss_fn = setups[case]
    ours, theirs = cbm_pair(50, miner_pair(), loss_fn, backend)
    for step in range(9):  # batches of 12 into 50 slots: wraps several times
        x, y = random_batch(n=12, classes=classes, seed=100 + step)
        x.requires_grad_(True)
        a, b = ours(x, y), theirs(x, y)
        assert a.item() == pytest.approx(b.item(), rel=1e-5, abs=1e-6), step
        (g,) = torch.autograd.grad(a, x)
        (h,) = torch.autograd.grad(b, x)
        assert torch.allclose(g, h, rtol=1e-4, atol=1e-6)
        assert ours.queue_idx == theirs.queue_idx and ours.has_been_filled == theirs.has_been_filled
        assert torch.equal(ours.embedding_memory, theirs.embedding_memory)
        assert torch.equal(ours.label_memory, theirs.label_memory)


def test_cross_batch_memory_with_enqueue_mask_and_input_indices(backend):
    ours, theirs = cbm_pair(
        30,
        (drop.TripletMarginMiner(backend=backend), miners.TripletMarginMiner()),
        lambda: losses.TripletMarginLoss(),
        backend,
    )
    for step in range(6):
        x, y = random_batch(n=10, classes=3, seed=200 + step)
        mask = torch.arange(10) % 2 == 0
        assert ours(x, y, enqueue_mask=mask).item() == pytest.approx(
            theirs(x, y, enqueue_mask=mask).item(), rel=1e-5, abs=1e-6
        )
        extra = (torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5]))
        assert ours(x, y, indices_tuple=extra).item() == pytest.approx(
            theirs(x, y, indices_tuple=extra).item(), rel=1e-5, abs=1e-6
        )
    with pytest.raises(ValueError):
        ours(x, y, indices_tuple=extra, enqueue_mask=mask)
    with pytest.raises(ValueError, match="does not fit"):
        ours(*random_batch(n=31))


def test_our_miner_inside_pmls_cross_batch_memory(backend):
    ours = losses.CrossBatchMemory(losses.TripletMarginLoss(), 8, memory_size=40,
                                   miner=drop.TripletMarginMiner(type_of_triplets="hard", backend=backend))
    theirs = losses.CrossBatchMemory(losses.TripletMarginLoss(), 8, memory_size=40,
                                     miner=miners.TripletMarginMiner(type_of_triplets="hard"))
    for step in range(5):
        x, y = random_batch(n=16, classes=4, seed=300 + step)
        assert ours(x, y).item() == pytest.approx(theirs(x, y).item(), rel=1e-5, abs=1e-6)


def test_pml_miner_inside_our_cross_batch_memory(backend):
    ours = drop.CrossBatchMemory(losses.TripletMarginLoss(), 8, memory_size=40,
                                 miner=miners.TripletMarginMiner(type_of_triplets="hard"), backend=backend)
    theirs = losses.CrossBatchMemory(losses.TripletMarginLoss(), 8, memory_size=40,
                                     miner=miners.TripletMarginMiner(type_of_triplets="hard"))
    for step in range(5):
        x, y = random_batch(n=16, classes=4, seed=400 + step)
        assert ours(x, y).item() == pytest.approx(theirs(x, y).item(), rel=1e-5, abs=1e-6)
    with pytest.raises(Exception, match="not supported"):
        drop.CrossBatchMemory(losses.ArcFaceLoss(10, 8), 8)


def angle_grid(angles, d=2):
    """PML's test recipe: unit rows at the given angles (degrees), padded with zeros to `d`."""
    rad = np.radians(np.asarray(angles, dtype=np.float64))
    x = np.zeros((len(rad), d), dtype=np.float32)
    x[:, 0], x[:, 1] = np.cos(rad), np.sin(rad)
    return torch.from_numpy(x)


def test_ties_by_construction_give_pmls_exact_triplets_and_neighbours():
    """Rows normalised as torch normalises them (division by the norm): a triplet tied by
    construction (cos 1° on both sides) is a tie for us as for PML, on the native path. The
    wgpu path cannot promise it (WGSL's division is accurate to 2.5 ulp)."""
    grid = angle_grid(range(16))
    dup = torch.cat([grid[:6], grid[:6] * 3.0, grid[6:9]])  # duplicated rows, other norms
    rng = torch.Generator().manual_seed(5)
    for x in (grid, dup):
        for _ in range(6):
            y = torch.randint(0, 3, (len(x),), generator=rng)
            for distance in (distances.CosineSimilarity(), distances.LpDistance()):
                for kind in ("all", "hard", "semihard", "easy"):
                    for margin in (0.0, 0.05, 0.2):
                        ours = drop.TripletMarginMiner(
                            margin, type_of_triplets=kind, distance=distance, backend="cpu"
                        )(x, y)
                        theirs = miners.TripletMarginMiner(
                            margin, type_of_triplets=kind, distance=distance
                        )(x, y)
                        assert_same_tuple(ours, theirs)
        knn = drop.KNN(distance=distances.CosineSimilarity(), backend="cpu")
        got = knn(x, 4, x, True)
        want = CustomKNN(distances.CosineSimilarity())(x, 4, x, True)
        # Equal values (the ties) are the point: torch's topk leaves their order unspecified.
        assert torch.equal(got[0], want[0])


def test_cross_batch_memory_has_pmls_attribute_surface():
    """Assignable memory and queue state, .to/.type, state_dict, add_to_memory and
    create_indices_tuple as PML's CrossBatchMemory, side by side with it."""
    g = torch.Generator().manual_seed(9)
    ours = drop.CrossBatchMemory(losses.ContrastiveLoss(), 4, memory_size=10, backend="cpu")
    theirs = losses.CrossBatchMemory(losses.ContrastiveLoss(), 4, memory_size=10)

    def same_state():
        assert torch.equal(ours.embedding_memory, theirs.embedding_memory)
        assert torch.equal(ours.label_memory, theirs.label_memory)
        assert ours.embedding_memory.dtype == theirs.embedding_memory.dtype
        assert (ours.queue_idx, ours.has_been_filled) == (theirs.queue_idx, theirs.has_been_filled)

    for step in range(4):
        x, y = torch.randn(3, 4, generator=g), torch.randint(0, 3, (3,), generator=g)
        assert torch.allclose(ours(x, y), theirs(x, y), atol=1e-6)
        same_state()
        if step == 1:
            # Move, cast and assign as users (and PML's tests) do.
            for cbm in (ours, theirs):
                cbm.embedding_memory = cbm.embedding_memory.to("cpu").type(torch.float32) * 2
                cbm.label_memory = cbm.label_memory + 1
            same_state()
    for cbm in (ours, theirs):
        cbm.queue_idx = 7
    same_state()
    x, y = torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)
    assert torch.allclose(ours(x, y), theirs(x, y), atol=1e-6)
    same_state()  # wrapped: filled
    for cbm in (ours, theirs):
        cbm.has_been_filled = False
        cbm.queue_idx = 2
    same_state()
    # add_to_memory and create_indices_tuple on the tensors given, as PML.
    for cbm in (ours, theirs):
        cbm.add_to_memory(x[:2], y[:2], 2)
    same_state()
    assert torch.equal(ours.curr_batch_idx, theirs.curr_batch_idx)
    pair_miner = miners.PairMarginMiner(pos_margin=0, neg_margin=1)
    given = pair_miner(x[:2], y[:2])
    args = (x[:2], y[:2], theirs.embedding_memory, theirs.label_memory, given, True)
    for a, b in zip(ours.create_indices_tuple(*args), theirs.create_indices_tuple(*args)):
        assert torch.equal(a, b)
    # state_dict round trip into a fresh memory; .double() casts the memory as PML's buffers.
    fresh = drop.CrossBatchMemory(losses.ContrastiveLoss(), 4, memory_size=10, backend="cpu")
    fresh.load_state_dict(ours.state_dict())
    assert torch.equal(fresh.embedding_memory, ours.embedding_memory)
    assert set(ours.state_dict()) >= {"embedding_memory", "label_memory"}
    assert ours.double().embedding_memory.dtype == theirs.double().embedding_memory.dtype
    # What cannot be honoured raises.
    with pytest.raises(ValueError):
        ours.embedding_memory = torch.zeros(3, 4)
    with pytest.raises(ValueError):
        ours.queue_idx = 10
    ours.memory_size = 6  # a new, empty memory of that size
    assert (ours.queue_idx, ours.embedding_memory.shape) == (0, (6, 4))


def test_accuracy_with_our_knn_equals_pmls_custom_knn_on_digits():
    """The issue's target: on sklearn's digits, AccuracyCalculator with the native KNN equals
    PML's CustomKNN(CosineSimilarity()) within 1e-7 (ties broken alike once rows are
    normalised as torch normalises them)."""
    datasets = pytest.importorskip("sklearn.datasets")
    features, target = datasets.load_digits(return_X_y=True)
    x, y = torch.tensor(features, dtype=torch.float32), torch.tensor(target)
    include = KNN_METRICS
    theirs = AccuracyCalculator(
        include=include, knn_func=CustomKNN(distances.CosineSimilarity())
    ).get_accuracy(x, y)
    ours = AccuracyCalculator(
        include=include, knn_func=drop.KNN(distances.CosineSimilarity(), backend="cpu")
    ).get_accuracy(x, y)
    for name in include:
        assert ours[name] == pytest.approx(theirs[name], abs=1e-7), name
