"""k-means, NMI and AMI against scikit-learn, Faiss and PML's AccuracyCalculator."""

import numpy as np
import pytest

import wgpu_metric_learning as wml

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def blobs(n, d, classes, spread, seed):
    """``n`` points around ``classes`` random centres in [-10, 10]^d, and their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, (classes, d))
    labels = np.arange(n) % classes
    x = centres[labels] + rng.normal(0, spread, (n, d))
    return x.astype(np.float32), labels.astype(np.int64)


def labelings(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 500))
    a = rng.integers(0, int(rng.integers(1, 40)), n)
    b = rng.integers(0, int(rng.integers(1, 40)), n)
    if seed % 3 == 0:  # related labelings: high scores
        b = (a * 7 + (rng.random(n) < 0.2) * rng.integers(0, 5, n)) % 13
    if seed % 5 == 0:  # big label values, negative ones
        a = a * 1_000_003 - 50
    return a, b


EDGE_CASES = [
    ([], []),
    ([3], [3]),
    ([1, 1, 1], [2, 2, 2]),
    ([1, 1, 1], [1, 2, 3]),
    ([1, 2, 3], [1, 1, 1]),
    ([0, 0, 1, 1], [0, 0, 1, 1]),
    ([0, 0, 1, 1], [1, 1, 0, 0]),
    ([0, 0, 1, 1], [0, 1, 0, 1]),
    ([0, 1, 2, 3], [0, 1, 2, 3]),
    ([5, 5, 5, 7], [0, 1, 2, 3]),
]


@pytest.mark.parametrize("seed", range(60))
def test_mutual_information_equals_scikit_learn(seed):
    a, b = labelings(seed)
    assert wml.normalized_mutual_info(a, b) == pytest.approx(
        sklearn_metrics.normalized_mutual_info_score(a, b), abs=1e-11
    )
    assert wml.adjusted_mutual_info(a, b) == pytest.approx(
        sklearn_metrics.adjusted_mutual_info_score(a, b), abs=1e-11
    )


@pytest.mark.parametrize("a,b", EDGE_CASES)
def test_mutual_information_edge_cases(a, b):
    a, b = np.array(a, np.int64), np.array(b, np.int64)
    assert wml.normalized_mutual_info(a, b) == pytest.approx(
        sklearn_metrics.normalized_mutual_info_score(a, b), abs=1e-12
    )
    assert wml.adjusted_mutual_info(a, b) == pytest.approx(
        sklearn_metrics.adjusted_mutual_info_score(a, b), abs=1e-12
    )


def test_mutual_information_errors():
    with pytest.raises(ValueError):
        wml.normalized_mutual_info(np.zeros(3, np.int64), np.zeros(4, np.int64))
    with pytest.raises(TypeError):
        wml.adjusted_mutual_info(np.zeros(3, np.float32), np.zeros(3, np.int64))


def test_kmeans_result(ctx):
    x, _ = blobs(500, 6, 5, 1.0, 0)
    out = wml.kmeans(ctx, x, 5)
    assert out.centroids.shape == (5, 6) and out.centroids.dtype == np.float32
    assert out.assignments.shape == (500,) and out.assignments.dtype == np.uint32
    assert out.inertia == pytest.approx(float(out.distances.astype(np.float64).sum()))
    assert 0 < out.iterations <= 20
    # Each point's centroid is its nearest (exactly, up to float32 rounding).
    d2 = ((x[:, None, :].astype(np.float64) - out.centroids[None].astype(np.float64)) ** 2).sum(-1)
    picked = d2[np.arange(500), out.assignments]
    assert np.all(picked <= d2.min(1) + 1e-3 * (1 + d2.min(1)))
    assert np.allclose(out.distances, picked, rtol=1e-4, atol=1e-3)
    # A function of the points and the seed, on every path.
    again = wml.kmeans(ctx, x, 5)
    assert np.array_equal(again.assignments, out.assignments)
    # The same clustering on the native path (devices round differently: a near tie could
    # move a point, hardly more).
    native = wml.kmeans(wml.Context(backend="cpu"), x, 5)
    assert wml.normalized_mutual_info(native.assignments, out.assignments) > 0.99


def test_kmeans_errors(ctx):
    x, _ = blobs(10, 3, 2, 1.0, 0)
    for clusters in (0, 11):
        with pytest.raises(ValueError, match="clusters"):
            wml.kmeans(ctx, x, clusters)
    with pytest.raises(ValueError, match="tolerance"):
        wml.kmeans(ctx, x, 2, tolerance=-1.0)
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError):
        wml.kmeans(ctx, bad, 2)


def test_kmeans_is_as_good_as_faiss():
    """Same data, same settings (PML's niter=20, Faiss's defaults): over five seeds each, our
    objective and NMI to the true blobs match Faiss's on average (different random draws)."""
    faiss = pytest.importorskip("faiss")
    x, y = blobs(3000, 16, 30, 4.0, 1)
    ctx = wml.Context(backend="cpu")
    ours, theirs = [], []
    for seed in range(5):
        km = wml.kmeans(ctx, x, 30, seed=seed)
        ours.append((km.inertia, wml.normalized_mutual_info(y, km.assignments)))
        f = faiss.Kmeans(16, 30, niter=20, seed=seed)
        f.train(x)
        dist, idx = f.index.search(x, 1)
        theirs.append((float(dist.sum()), sklearn_metrics.normalized_mutual_info_score(y, idx[:, 0])))
    ours, theirs = np.mean(ours, 0), np.mean(theirs, 0)
    assert ours[0] <= theirs[0] * 1.05, (ours, theirs)
    assert ours[1] >= theirs[1] - 0.02, (ours, theirs)


def test_accuracy_includes_nmi_and_ami(ctx):
    x, y = blobs(600, 8, 12, 5.0, 2)
    acc = wml.accuracy(ctx, x, y, include=["precision_at_1", "NMI", "AMI"])
    assert set(acc.metrics) == {"precision_at_1", "NMI", "AMI"}
    clusters = wml.kmeans(ctx, x, 12).assignments.astype(np.int64)
    assert acc.metrics["NMI"] == pytest.approx(
        sklearn_metrics.normalized_mutual_info_score(y, clusters), abs=1e-12
    )
    assert acc.metrics["AMI"] == pytest.approx(
        sklearn_metrics.adjusted_mutual_info_score(y, clusters), abs=1e-11
    )
    only = wml.accuracy(ctx, x, y, include=["AMI"])
    assert set(only.metrics) == {"AMI"} and only.k == 0 and only.per_class == {}
    assert only.metrics["AMI"] == acc.metrics["AMI"]
    other_seed = wml.accuracy(ctx, x, y, include=["NMI"], kmeans_seed=7).metrics["NMI"]
    assert 0 < other_seed <= 1
    default = wml.accuracy(ctx, x, y)
    assert "NMI" not in default.metrics and len(default.metrics) == 5
    with pytest.raises(ValueError, match="include"):
        wml.accuracy(ctx, x, y, include=["nmi"])
    with pytest.raises(ValueError, match="include"):
        wml.accuracy(ctx, x, y, include=[])
    with pytest.raises(TypeError):
        wml.accuracy(ctx, x, y, include="NMI")


def test_accuracy_calculator_with_the_kmeans_drop_in():
    """PML's AccuracyCalculator with our kmeans_func: its NMI and AMI equal scikit-learn's of
    our clusters, and are no worse than PML's own (Faiss k-means) on clustered data."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("faiss")
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    from wgpu_metric_learning import pml as drop

    x, y = blobs(2000, 16, 20, 6.0, 3)
    q, labels = torch.from_numpy(x), torch.from_numpy(y)
    include = ("NMI", "AMI", "precision_at_1")
    ours = AccuracyCalculator(include=include, kmeans_func=drop.KMeans(backend="cpu"))
    theirs = AccuracyCalculator(include=include, device=torch.device("cpu"))
    a, b = ours.get_accuracy(q, labels), theirs.get_accuracy(q, labels)
    clusters = drop.KMeans(backend="cpu")(q, 20)
    assert clusters.dtype == torch.int64 and clusters.shape == (2000,)
    assert a["NMI"] == sklearn_metrics.normalized_mutual_info_score(y, clusters.numpy())
    # One random draw each (different generators): ours no worse than Faiss's, give or take.
    assert a["NMI"] >= b["NMI"] - 0.02 and a["AMI"] >= b["AMI"] - 0.03, (a, b)
    assert a["precision_at_1"] == b["precision_at_1"]
    # The library's own accuracy gives the same clustering scores.
    ctx = drop.KMeans(backend="cpu").context
    got = wml.accuracy(ctx, x, y, include=list(include)).metrics
    assert got["NMI"] == pytest.approx(a["NMI"], abs=1e-12)
    assert got["AMI"] == pytest.approx(a["AMI"], abs=1e-11)
