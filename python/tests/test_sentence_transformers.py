"""The sentence-transformers drop-ins against sentence-transformers 6 itself, on a small model
built here (no download): loss values within 1e-5 relative and every parameter's gradient
within 1e-4 of the largest, for MNRL, CachedMNRL, the symmetric loss and MatryoshkaLoss around
both, with hard-negative columns and weights; and the Matryoshka widths of the native
functions against the loss run once per truncated copy."""

import random

import numpy as np
import pytest
import torch
from torch import nn

import wgpu_metric_learning as wml

st = pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer import losses as st_losses  # noqa: E402
from sentence_transformers.util import dot_score  # noqa: E402

from wgpu_metric_learning import sentence_transformers as wst  # noqa: E402

WIDTH = 96
VOCAB = 500


class Tiny(nn.Module):
    """A stand-in encoder: mean token embedding, then two layers."""

    def __init__(self, width: int = WIDTH, hidden: int = 48) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, hidden, mode="mean")
        self.l1 = nn.Linear(hidden, hidden)
        self.l2 = nn.Linear(hidden, width)
        self.width = width

    def forward(self, features):
        x = torch.tanh(self.l1(self.emb(features["input_ids"])))
        features["sentence_embedding"] = self.l2(x)
        return features

    def get_embedding_dimension(self) -> int:
        return self.width


def model(seed: int = 0) -> SentenceTransformer:
    torch.manual_seed(seed)
    return SentenceTransformer(modules=[Tiny()], device="cpu")


def features(batch: int, columns: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, VOCAB, (batch, 9), generator=g),
            "attention_mask": torch.ones(batch, 9, dtype=torch.long),
        }
        for _ in range(columns)
    ]


def run(m: SentenceTransformer, loss, feats):
    """The loss value and every parameter's gradient after ``backward``."""
    m.zero_grad()
    value = loss([dict(f) for f in feats], None)
    value.backward()
    return value.item(), {n: p.grad.clone() for n, p in m.named_parameters()}


def assert_same(ours, theirs, what: str) -> None:
    (v, g), (w, h) = ours, theirs
    assert abs(v - w) <= 1e-5 * max(abs(w), 1e-6), f"{what}: loss {v} vs {w}"
    top = max(t.abs().max().item() for t in h.values())
    for name in h:
        err = (g[name] - h[name]).abs().max().item()
        assert err <= 1e-4 * top, f"{what}: {name} off by {err} (largest {top})"


@pytest.fixture
def library_calls(monkeypatch):
    """Counts the library's MNRL calls, so that a test knows its drop-in did not fall back."""
    calls = []
    real = wml._native.multiple_negatives_ranking_loss

    def counted(*args, **kwargs):
        calls.append(kwargs.get("matryoshka_dims"))
        return real(*args, **kwargs)

    monkeypatch.setattr(wml._native, "multiple_negatives_ranking_loss", counted)
    return calls


def pair(make_ours, make_theirs, columns: int, batch: int = 40, seed: int = 1):
    m = model()
    feats = features(batch, columns, seed)
    return run(m, make_ours(m), feats), run(m, make_theirs(m), feats)


@pytest.mark.parametrize("columns", [2, 4])
@pytest.mark.parametrize("scale", [20.0, 7.5])
def test_mnrl_matches_sentence_transformers(columns, scale, library_calls):
    ours, theirs = pair(
        lambda m: wst.MultipleNegativesRankingLoss(m, scale=scale),
        lambda m: st_losses.MultipleNegativesRankingLoss(m, scale=scale),
        columns,
    )
    assert_same(ours, theirs, f"MNRL columns={columns} scale={scale}")
    assert library_calls == [None]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("columns", [2, 3])
def test_symmetric_matches_sentence_transformers(columns, library_calls):
    ours, theirs = pair(
        lambda m: wst.MultipleNegativesSymmetricRankingLoss(m),
        lambda m: st_losses.MultipleNegativesSymmetricRankingLoss(m),
        columns,
    )
    assert_same(ours, theirs, "symmetric")
    # The same through MNRL's own options.
    kw = dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
    ours, theirs = pair(
        lambda m: wst.MultipleNegativesRankingLoss(m, **kw),
        lambda m: st_losses.MultipleNegativesRankingLoss(m, **kw),
        columns,
    )
    assert_same(ours, theirs, "per-direction MNRL")
    assert len(library_calls) == 4


@pytest.mark.parametrize("columns", [2, 3])
def test_cached_mnrl_matches_sentence_transformers(columns, library_calls):
    ours, theirs = pair(
        lambda m: wst.CachedMultipleNegativesRankingLoss(m, mini_batch_size=16),
        lambda m: st_losses.CachedMultipleNegativesRankingLoss(m, mini_batch_size=16),
        columns,
    )
    assert_same(ours, theirs, f"cached columns={columns}")
    assert library_calls == [None]


MATRYOSHKA = [
    ([WIDTH, 64, 32, 8], None),
    ([8, WIDTH, 33, 33], [0.5, 1.0, 2.0, 0.25]),  # out of order, repeated, odd
    ([WIDTH], [1.5]),
]


@pytest.mark.parametrize("dims,weights", MATRYOSHKA)
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("columns", [2, 3])
def test_matryoshka_matches_sentence_transformers(dims, weights, cached, columns, library_calls):
    def make(ns):
        def build(m):
            inner = (
                ns.CachedMultipleNegativesRankingLoss(m, mini_batch_size=16)
                if cached
                else ns.MultipleNegativesRankingLoss(m)
            )
            return ns.MatryoshkaLoss(m, inner, dims, weights)

        return build

    ours, theirs = pair(make(wst), make(st_losses), columns)
    assert_same(ours, theirs, f"matryoshka {dims} {weights} cached={cached}")
    # One pass over every width.
    assert library_calls == [sorted(dims, reverse=True)]


@pytest.mark.parametrize("cached", [False, True])
def test_matryoshka_draws_the_same_widths_per_step(cached, library_calls):
    dims = [WIDTH, 64, 32, 16, 8]

    def make(ns):
        def build(m):
            inner = (
                ns.CachedMultipleNegativesRankingLoss(m, mini_batch_size=16)
                if cached
                else ns.MultipleNegativesRankingLoss(m)
            )
            return ns.MatryoshkaLoss(m, inner, dims, n_dims_per_step=2)

        return build

    m = model()
    feats = features(32, 2, 3)
    random.seed(7)
    ours = run(m, make(wst)(m), feats)
    random.seed(7)
    theirs = run(m, make(st_losses)(m), feats)
    assert_same(ours, theirs, "n_dims_per_step")
    assert len(library_calls) == 1 and len(library_calls[0]) == 2


def test_options_the_library_does_not_run_fall_back(monkeypatch):
    # GTE's four directions, hardness weighting, and a dot-product similarity run
    # sentence-transformers' own code: exactly its answers, and the library never called.
    def refuse(*args, **kwargs):
        raise AssertionError("the library ran an option it does not compute")

    monkeypatch.setattr(wml._native, "multiple_negatives_ranking_loss", refuse)
    options = [
        dict(directions=("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")),
        dict(hardness_mode="in_batch_negatives", hardness_strength=5.0),
        dict(similarity_fct=dot_score, scale=1.0),
    ]
    for kw in options:
        ours, theirs = pair(
            lambda m: wst.MultipleNegativesRankingLoss(m, **kw),
            lambda m: st_losses.MultipleNegativesRankingLoss(m, **kw),
            3,
        )
        assert_same(ours, theirs, f"fallback {kw}")
        ours, theirs = pair(
            lambda m: wst.MatryoshkaLoss(
                m, wst.CachedMultipleNegativesRankingLoss(m, mini_batch_size=16, **kw), [WIDTH, 32]
            ),
            lambda m: st_losses.MatryoshkaLoss(
                m, st_losses.CachedMultipleNegativesRankingLoss(m, mini_batch_size=16, **kw),
                [WIDTH, 32],
            ),
            3,
        )
        assert_same(ours, theirs, f"cached matryoshka fallback {kw}")


def test_drop_ins_are_sentence_transformers_losses():
    m = model()
    assert isinstance(wst.MultipleNegativesRankingLoss(m), st_losses.MultipleNegativesRankingLoss)
    cached = wst.CachedMultipleNegativesRankingLoss(m)
    assert isinstance(cached, st_losses.CachedMultipleNegativesRankingLoss)
    assert isinstance(wst.MatryoshkaLoss(m, cached, [64]), st_losses.MatryoshkaLoss)
    assert cached.get_config_dict()["mini_batch_size"] == 32


def _cosines(a, b):
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return a @ b.T


def test_native_widths_are_the_loss_per_truncated_copy(ctx):
    rng = np.random.default_rng(5)
    anchors = rng.normal(size=(12, 20)).astype(np.float32)
    candidates = rng.normal(size=(30, 20)).astype(np.float32)
    dims, weights = [20, 5, 12, 5, 1], [1.0, 0.5, 2.0, 0.5, 0.1]
    out = wml._native.multiple_negatives_ranking_loss(
        ctx, anchors, candidates, scale=20.0, matryoshka_dims=dims, matryoshka_weights=weights
    )
    assert len(out) == 6
    value, _, _, grad, cand_grad, per_width = out
    want_total = 0.0
    want_grad = np.zeros_like(anchors, dtype=np.float64)
    want_cand = np.zeros_like(candidates, dtype=np.float64)
    for k, (e, w) in enumerate(zip(dims, weights)):
        one = wml._native.multiple_negatives_ranking_loss(
            ctx, np.ascontiguousarray(anchors[:, :e]), np.ascontiguousarray(candidates[:, :e])
        )
        assert len(one) == 5
        assert per_width[k] == pytest.approx(one[0], rel=1e-5)
        want_total += w * one[0]
        want_grad[:, :e] += w * one[3]
        want_cand[:, :e] += w * one[4]
    assert value == pytest.approx(want_total, rel=1e-5)
    np.testing.assert_allclose(grad, want_grad, atol=1e-4 * np.abs(want_grad).max())
    np.testing.assert_allclose(cand_grad, want_cand, atol=1e-4 * np.abs(want_cand).max())
    # Logits exactly as the plain loss takes them, at one width.
    s = _cosines(anchors[:, :5], candidates[:, :5]) * 20.0
    lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    assert per_width[1] == pytest.approx(float(np.mean(lse - s[np.arange(12), np.arange(12)])), rel=1e-5)


def test_native_widths_reject_bad_values(ctx):
    x = np.ones((4, 6), dtype=np.float32)
    labels = np.array([0, 0, 1, 1])
    for kw in (
        dict(matryoshka_dims=[]),
        dict(matryoshka_dims=[7]),
        dict(matryoshka_dims=[0]),
        dict(matryoshka_dims=[2, 3], matryoshka_weights=[1.0]),
        dict(matryoshka_weights=[1.0]),
    ):
        with pytest.raises(ValueError):
            wml._native.multiple_negatives_ranking_loss(ctx, x, x, **kw)
        with pytest.raises(ValueError):
            wml._native.ntxent_loss(ctx, x, labels, **kw)
    with pytest.raises(ValueError):
        wml._native.ntxent_loss(ctx, x, labels, distance="euclidean", matryoshka_dims=[3])
    out = wml._native.ntxent_loss(ctx, x, labels, matryoshka_dims=[6, 2])
    assert len(out) == 6 and len(out[5]) == 2
