"""The library's API from Python, against plain NumPy references (no torch needed)."""

import signal
import threading
import time

import numpy as np
import pytest

import wgpu_metric_learning as wml


def _data(n=60, d=8, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, classes, n)


def _euclidean(a, b, normalize=True):
    if normalize:
        a = a / np.linalg.norm(a, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sqrt(((a[:, None, :].astype(np.float64) - b[None, :, :]) ** 2).sum(-1))


def _all_triplets(y, ry=None):
    same = ry is None
    ry = y if same else ry
    out = []
    for a in range(len(y)):
        for p in range(len(ry)):
            if ry[p] != y[a] or (same and p == a):
                continue
            for n in range(len(ry)):
                if ry[n] != y[a]:
                    out.append((a, p, n))
    return np.array(out, dtype=np.uint32).reshape(-1, 3)


def test_pairwise_distances_match_numpy(ctx):
    x, _ = _data()
    r = _data(n=30, seed=1)[0]
    for normalize in (True, False):
        got = wml.pairwise_distances(ctx, x, r, normalize=normalize)
        assert got.shape == (60, 30) and got.dtype == np.float32
        np.testing.assert_allclose(got, _euclidean(x, r, normalize), rtol=1e-4, atol=1e-4)
    cos = wml.pairwise_distances(ctx, x, distance="cosine")
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(cos, xn @ xn.T, atol=1e-5)


def test_inputs_of_any_layout_and_dtype(ctx):
    x, _ = _data(d=16)
    strided = np.asfortranarray(x)[:, ::2]  # neither C- nor F-contiguous rows
    as_f64 = strided.astype(np.float64)
    a = wml.pairwise_distances(ctx, strided)
    b = wml.pairwise_distances(ctx, as_f64)
    c = wml.pairwise_distances(ctx, np.ascontiguousarray(strided))
    # Same values up to rounding (the GEMM may sum in another order for another layout; near
    # zero, the sqrt of a rounding error shows).
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(b, c, rtol=1e-5, atol=1e-3)


def test_knn_excludes_the_query_itself_and_ranks_like_numpy(ctx):
    x, _ = _data(n=80)
    found = wml.knn(ctx, x, k=5)
    d = _euclidean(x, x)
    np.fill_diagonal(d, np.inf)
    np.testing.assert_array_equal(found.indices, np.argsort(d, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(found.scores, np.sort(d, axis=1)[:, :5], rtol=1e-4, atol=1e-4)
    # Explicit references: nothing excluded unless asked.
    own = wml.knn(ctx, x, x, k=1)
    np.testing.assert_array_equal(own.indices[:, 0], np.arange(80))
    same = wml.knn(ctx, x, x, k=5, self_exclusion="same_index")
    np.testing.assert_array_equal(same.indices, found.indices)


def test_all_valid_triplets_match_brute_force(ctx):
    _, y = _data(n=25, classes=4)
    _, ry = _data(n=31, classes=4, seed=3)
    np.testing.assert_array_equal(wml.mine_triplets(ctx, None, y), _all_triplets(y))
    np.testing.assert_array_equal(
        wml.mine_triplets(ctx, None, y, (None, ry)), _all_triplets(y, ry)
    )
    assert wml.count_triplets(ctx, None, y) == len(_all_triplets(y))


def test_margin_miner_matches_its_definition(ctx):
    x, y = _data(n=40, classes=4)
    d = _euclidean(x, x)
    for kind in ("all", "hard", "semihard", "easy"):
        got = wml.mine_triplets(ctx, x, y, type_of_triplets=kind, margin=0.2)
        want = []
        for a, p, n in _all_triplets(y):
            tm = d[a, n] - d[a, p]
            keep = {"all": tm <= 0.2, "hard": tm <= 0, "semihard": 0 < tm <= 0.2, "easy": tm > 0.2}
            if keep[kind]:
                want.append((a, p, n))
        np.testing.assert_array_equal(got, np.array(want, dtype=np.uint32).reshape(-1, 3))


def test_streamed_triplets_are_the_mined_ones_in_order(ctx):
    x, y = _data(n=50, classes=3)
    whole = wml.mine_triplets(ctx, x, y, type_of_triplets="all")
    it = wml.iter_triplets(ctx, x, y, type_of_triplets="all", max_chunk_triplets=500)
    chunks = list(it)
    assert len(chunks) > 2 and all(len(c) <= 500 for c in chunks[:-1])
    np.testing.assert_array_equal(np.concatenate(chunks), whole)
    assert it.count == len(whole)
    # Closing early stops the mining thread; the iterator then ends.
    early = wml.iter_triplets(ctx, None, y, max_chunk_triplets=100)
    next(early)
    early.close()
    assert list(early) == []
    assert early.count is None  # never ran to its end


def test_pair_miners_keep_their_rules(ctx):
    x, y = _data(n=30, classes=3)
    d = _euclidean(x, x)
    pos, neg = wml.all_pairs(ctx, y)
    same = (y[:, None] == y[None, :]) & ~np.eye(30, dtype=bool)
    np.testing.assert_array_equal(pos, np.argwhere(same))
    np.testing.assert_array_equal(neg, np.argwhere(y[:, None] != y[None, :]))
    pm = wml.pair_margin_pairs(ctx, x, y, pos_margin=0.9, neg_margin=1.2)
    np.testing.assert_array_equal(pm.positives, np.argwhere(same & (d > 0.9)))
    np.testing.assert_array_equal(pm.negatives, np.argwhere((y[:, None] != y[None, :]) & (d < 1.2)))
    hard = wml.batch_hard_triplets(ctx, x, y)
    for a, p, n in hard:
        assert d[a, p] == pytest.approx(d[a][same[a]].max(), abs=1e-5)
        assert d[a, n] == pytest.approx(d[a][y != y[a]].min(), abs=1e-5)


def test_accuracy_by_hand():
    ctx = wml.Context(backend="cpu")
    x = np.array([[0, 0], [0, 0.1], [5, 5], [5, 5.1], [9, 0]], dtype=np.float32)
    y = np.array([0, 0, 1, 1, 2])
    acc = wml.accuracy(ctx, x, y)
    assert acc.metrics["precision_at_1"] == 1.0
    assert acc.lone_queries == 1
    assert set(acc.per_class) == {0, 1}


def test_memory_bank_ring_and_checkpoint(ctx, tmp_path):
    bank = wml.MemoryBank(ctx, capacity=5, dim=2)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    done = bank.enqueue(x, [1, 2, 3, 4])
    np.testing.assert_array_equal(done.slots, [0, 1, 2, 3])
    np.testing.assert_array_equal(done.self_exclusion, [0, 1, 2, 3])
    done = bank.enqueue(x[:3] + 100, [5, 6, 7])  # wraps
    np.testing.assert_array_equal(done.slots, [4, 0, 1])
    assert bank.is_filled and len(bank) == 5 and bank.head == 2
    emb, lab = bank.snapshot()
    np.testing.assert_array_equal(lab, [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(emb[0], x[1] + 100)
    # Mining against the bank never pairs a row with its own slot.
    t = wml.mine_triplets(ctx, x[:3] + 100, [5, 6, 7], bank, self_exclusion=done.self_exclusion)
    assert len(t) == 0
    path = tmp_path / "bank.ckpt"
    assert bank.save(path) > 0
    back = wml.MemoryBank.load(ctx, path, capacity=5, dim=2)
    np.testing.assert_array_equal(back.snapshot()[1], lab)
    with pytest.raises(ValueError):
        wml.MemoryBank.load(ctx, path, capacity=6, dim=2)
    (tmp_path / "junk").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError):
        wml.MemoryBank.load(ctx, tmp_path / "junk", capacity=5, dim=2)
    with pytest.raises(OSError):
        wml.MemoryBank.load(ctx, tmp_path / "missing", capacity=5, dim=2)
    # Masked enqueue (MoCo): the unmasked rows are the queries, nothing excluded.
    done = bank.enqueue(x, [1, 2, 3, 4], mask=np.array([True, False, True, False]))
    np.testing.assert_array_equal(done.query_rows, [1, 3])
    assert done.self_exclusion == "none"
    with pytest.raises(ValueError):
        bank.enqueue(np.zeros((6, 2), np.float32), np.zeros(6, np.int64))


def test_bank_of_another_context_is_refused(ctx):
    other = wml.Context(backend="cpu")
    bank = wml.MemoryBank(other, 4, 2)
    bank.enqueue(np.ones((2, 2), np.float32), [0, 1])
    with pytest.raises(ValueError, match="another Context"):
        wml.knn(ctx, np.ones((1, 2), np.float32), bank, k=1)


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda c: wml.knn(c, np.zeros(3, np.float32)), ValueError),  # 1-D
        (lambda c: wml.knn(c, np.array([[0.0, np.nan]]), np.ones((2, 2)), k=1), ValueError),
        (lambda c: wml.knn(c, np.ones((3, 2)), np.ones((3, 4)), k=1), ValueError),  # d differs
        (lambda c: wml.knn(c, np.ones((3, 2)), k=0), ValueError),
        (lambda c: wml.knn(c, np.ones((3, 2)), k=3), ValueError),  # only 2 others
        (lambda c: wml.knn(c, np.ones((3, 2)), distance="manhattan"), ValueError),
        (lambda c: wml.knn(c, np.array([["a", "b"]])), TypeError),
        (lambda c: wml.mine_triplets(c, None, np.array([0.5, 1.0])), TypeError),
        (lambda c: wml.mine_triplets(c, np.ones((3, 2)), [0, 1]), ValueError),  # lengths
        (lambda c: wml.mine_triplets(c, np.ones((3, 2)), [0, 1, 1], type_of_triplets="x"), ValueError),
        (lambda c: wml.mine_triplets(c, None, [0, 0, 1], type_of_triplets="all"), ValueError),
        (lambda c: wml.mine_triplets(c, None, [0, 1], self_exclusion=[0, 1, 2]), ValueError),
        (lambda c: wml.batch_easy_hard_pairs(c, np.ones((3, 2)), [0, 0, 1],
                                             pos_strategy="semihard", neg_strategy="semihard"), ValueError),
        (lambda c: wml.accuracy(c, np.ones((3, 2)), [0, 0, 1], k="some"), ValueError),
        (lambda c: wml.MemoryBank(c, 0, 2), ValueError),
    ],
)
def test_bad_input_raises_the_documented_exception(ctx, call, exc):
    with pytest.raises(exc):
        call(ctx)


def test_over_budget_is_a_memory_error():
    tiny = wml.Context(backend="cpu", budget=1024)
    x = np.ones((4000, 64), np.float32)
    with pytest.raises(MemoryError, match="budget"):
        wml.knn(tiny, x, k=1)
    with pytest.raises(ValueError):
        wml.Context(backend="quantum")


def test_ctrl_c_cancels_a_long_call():
    ctx = wml.Context(backend="cpu")
    x = np.random.default_rng(0).standard_normal((100000, 128)).astype(np.float32)
    start = time.perf_counter()
    wml.knn(ctx, x[:2000], x, k=10)
    one_tenth = time.perf_counter() - start  # a tenth of the queries below
    old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            wml.knn(ctx, x[:20000], x, k=10)
        stopped_after = time.perf_counter() - start
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # It stopped well before the whole search (ten times the measured tenth) would end.
    assert stopped_after < 5 * one_tenth + 0.5, (stopped_after, one_tenth)
    # The context is still usable, and nothing stayed allocated.
    assert ctx.memory()["current_bytes"] == 0
    assert wml.knn(ctx, x[:3], x, k=2).indices.shape == (3, 2)


def test_the_gil_is_released_while_computing():
    ctx = wml.Context(backend="cpu")
    x = np.random.default_rng(0).standard_normal((6000, 128)).astype(np.float32)
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        wml.knn(ctx, x, x, k=10)
    finally:
        done.set()
        t.join()
    assert len(ticks) > 10


def test_transfers_time_the_host_and_with_kernel_timing_each_kernel():
    x, _ = _data(200, 16)
    if not wml.list_adapters():
        pytest.skip("no adapter (WML_REQUIRE_GPU=1 fails in conftest instead)")
    timed = wml.Context(backend="gpu", kernel_timing=True)
    before = timed.transfers()
    wml.knn(timed, x, k=5)
    after = timed.transfers()
    for key in (
        "upload_seconds",
        "wait_seconds",
        "readback_seconds",
        "tune_seconds",
        "submit_seconds",
    ):
        assert after[key] >= before[key] >= 0.0
    assert after["wait_seconds"] > before["wait_seconds"], "a kNN waits for the device"
    kernels = after["kernels"]
    # Timestamps where the adapter has them (lavapipe does): every kernel that ran, timed.
    if kernels:
        assert "knn_select" in kernels and "row_norms" in kernels, kernels
        assert all(k["dispatches"] > 0 and k["gpu_seconds"] > 0 for k in kernels.values())
    assert wml.Context(backend="cpu").transfers()["kernels"] == {}


def test_making_a_context_prints_nothing_without_a_runtime_dir():
    # A container or an ssh session without XDG_RUNTIME_DIR: Mesa's Vulkan device-select
    # layer would print an error line per enumeration although nothing failed.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "NODEVICE_SELECT")}
    code = "import wgpu_metric_learning as wml; wml.Context(); wml.Context(backend='cpu')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_the_package_version_is_the_crates():
    from importlib.metadata import version

    assert wml.__version__ == version("wgpu-metric-learning")
    assert wml.__version__.count(".") == 2
