"""The GPU core of metric learning on every GPU vendor (wgpu: Vulkan, Metal, DX12, GL), with a
native multi-threaded CPU path: pairwise distances, triplet and pair mining in PML's exact order
and semantics with no size limit, a memory bank, exact kNN and PML's retrieval accuracy, all
planned under a device-memory budget.

NumPy in, NumPy out. Embeddings are ``float32`` ``(n, d)`` (other float or integer dtypes are
converted, aligned ``float32`` arrays of any strides are used without a copy; torch CPU
tensors work too), labels ``int64`` ``(n,)`` (any integer dtype is converted). Every call releases the GIL
and can be stopped with Ctrl-C (it then raises ``KeyboardInterrupt`` and frees what it held).
Errors are exceptions: bad input ``ValueError`` / ``TypeError``, a budget or out-of-memory
failure ``MemoryError``, a device failure ``RuntimeError``, a file error ``OSError``.

Example::

    import numpy as np
    import wgpu_metric_learning as wml

    ctx = wml.Context()                        # a GPU if there is one, else the CPU path
    x = np.random.rand(1000, 64).astype(np.float32)
    y = np.random.randint(0, 10, 1000)
    triplets = wml.mine_triplets(ctx, x, y, type_of_triplets="semihard")   # (t, 3) uint32
    found = wml.knn(ctx, x, k=5)               # a query is not its own neighbour
    print(wml.accuracy(ctx, x, y, k="max_bin_count").metrics["precision_at_1"])

Clustering: :func:`kmeans` (Faiss's k-means on the library's search),
:func:`normalized_mutual_info` and :func:`adjusted_mutual_info` (scikit-learn's), and NMI
and AMI in :func:`accuracy`'s ``include``.

Losses come with their gradients, computed without a triplet list or the whole similarity
matrix: :func:`triplet_margin_loss`, :func:`ntxent_loss`, :func:`multiple_negatives_ranking_loss`,
and PML's pair losses :func:`contrastive_loss`, :func:`multi_similarity_loss`,
:func:`supcon_loss`, :func:`circle_loss`, :func:`nca_loss`,
:func:`generalized_lifted_structure_loss`, :func:`margin_loss`, :func:`fast_ap_loss`,
:func:`lifted_structure_loss`, :func:`histogram_loss`, :func:`tuplet_margin_loss`,
:func:`intra_pair_variance_loss`, :func:`ranked_list_loss`,
:func:`threshold_consistent_margin_loss`, :func:`pnp_loss`, :func:`n_pairs_loss`,
:func:`instance_loss`, :func:`angular_loss`, :func:`snr_contrastive_loss`,
:func:`dynamic_soft_margin_loss`; :func:`vicreg_loss` (two views, no labels); and the losses
with class weights (ArcFace and its family), :func:`classifier_loss`.

``wgpu_metric_learning.pml`` has drop-ins for pytorch-metric-learning (``KNN`` for
``AccuracyCalculator``, the miners, ``CrossBatchMemory``, ``TripletMarginLoss`` and
``NTXentLoss`` with ``loss.backward()``).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._native import Context, TripletChunks, __version__, list_adapters

__all__ = [
    "__version__",
    "Accuracy",
    "Clustering",
    "Context",
    "Enqueued",
    "Knn",
    "Loss",
    "MemoryBank",
    "Pairs",
    "TripletChunks",
    "VicReg",
    "Classifier",
    "accuracy",
    "adjusted_mutual_info",
    "all_pairs",
    "angular_triplets",
    "batch_easy_hard_pairs",
    "batch_hard_triplets",
    "circle_loss",
    "contrastive_loss",
    "count_triplets",
    "default_context",
    "distance_weighted_triplets",
    "fast_ap_loss",
    "generalized_lifted_structure_loss",
    "hdc_pairs",
    "iter_triplets",
    "kmeans",
    "knn",
    "list_adapters",
    "mine_triplets",
    "margin_loss",
    "multi_similarity_loss",
    "multi_similarity_pairs",
    "nca_loss",
    "multiple_negatives_ranking_loss",
    "normalized_mutual_info",
    "ntxent_loss",
    "pair_margin_pairs",
    "pairwise_distances",
    "supcon_loss",
    "triplet_margin_loss",
    "uniform_histogram_pairs",
    "lifted_structure_loss",
    "histogram_loss",
    "tuplet_margin_loss",
    "intra_pair_variance_loss",
    "ranked_list_loss",
    "threshold_consistent_margin_loss",
    "pnp_loss",
    "n_pairs_loss",
    "instance_loss",
    "angular_loss",
    "vicreg_loss",
    "classifier_loss",
    "sampled_classes",
    "snr_contrastive_loss",
    "dynamic_soft_margin_loss",
]

_INT64_MAX = np.iinfo(np.int64).max


class Knn(NamedTuple):
    """The result of :func:`knn`: ``indices`` ``(q, k)`` uint32 and ``scores`` ``(q, k)``
    float32, best first (smallest distance, or largest similarity), ties to the lower index."""

    indices: np.ndarray
    scores: np.ndarray


class Pairs(NamedTuple):
    """The result of a pair miner: ``positives`` and ``negatives``, ``(p, 2)`` and ``(n, 2)``
    uint32 rows ``(query, reference)``."""

    positives: np.ndarray
    negatives: np.ndarray


class Enqueued(NamedTuple):
    """What :meth:`MemoryBank.enqueue` did: the ``slots`` written (uint32), the batch rows
    left as queries (``query_rows``, int64: all of them, or the unmasked ones), and the
    ``self_exclusion`` to pass to an operation whose references are the bank (the slot of
    each query, or ``"none"``)."""

    slots: np.ndarray
    query_rows: np.ndarray
    self_exclusion: Union[str, np.ndarray]


class VicReg(NamedTuple):
    """PML's VICReg loss, its weighted terms (as PML's sub-losses) and both views' gradients."""

    loss: float
    invariance: float
    #: Both views' variance terms.
    variance: float
    #: Both views' covariance terms.
    covariance: float
    #: ``∂loss/∂embeddings`` ``(n, d)`` float32 (both roles without a second view).
    grad: np.ndarray
    #: ``∂loss/∂ref_embeddings`` ``(n, d)`` float32 when a second view was given.
    ref_grad: Optional[np.ndarray]


class Classifier(NamedTuple):
    """The result of :func:`classifier_loss`: the mean loss, the rows in it, the gradients
    for the embeddings ``(b, d)`` and for the weights (in their layout, 0 on the classes a
    sampling left out), and the classes the softmax ran over."""

    loss: float
    count: int
    grad: np.ndarray
    weight_grad: np.ndarray
    classes_used: int


class Loss(NamedTuple):
    """A loss, what it averaged over, and its gradients."""

    loss: float
    #: Triplets with a positive loss (triplet margin), or positive pairs (InfoNCE): the
    #: mean's divisor.
    count: int
    #: Triplets considered (triplet margin), or negative pairs (InfoNCE).
    total: int
    #: ``∂loss/∂embeddings`` ``(b, d)`` float32 (both roles when no references were given).
    grad: np.ndarray
    #: ``∂loss/∂ref_embeddings`` ``(m, d)`` float32, when asked for (else ``None``).
    ref_grad: Optional[np.ndarray]
    #: ``∂loss/∂β`` of :func:`margin_loss` with ``learn_beta`` (else ``None``).
    beta_grad: Optional[float] = None


class Accuracy(NamedTuple):
    """The result of :func:`accuracy`: ``metrics`` (name → value, PML's names, the included
    metrics only), ``per_class`` (label → kNN metrics), the number of ``lone_queries`` left
    out, and the ``k`` searched (0 without a kNN metric)."""

    metrics: Dict[str, float]
    per_class: Dict[int, Dict[str, float]]
    lone_queries: int
    k: int


class Clustering(NamedTuple):
    """The result of :func:`kmeans`."""

    #: ``(k, d)`` float32: the final centroids.
    centroids: np.ndarray
    #: ``(n,)`` uint32: each point's nearest final centroid (ties to the lower index).
    assignments: np.ndarray
    #: ``(n,)`` float32: each point's squared L2 distance to its centroid.
    distances: np.ndarray
    #: The sum of ``distances``.
    inertia: float
    #: Centroid updates done (fewer than ``max_iterations`` when it stopped early).
    iterations: int


_default_lock = threading.Lock()
_default: Optional[Context] = None


def default_context() -> Context:
    """The process-wide ``Context()`` (automatic backend, default budget), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Context()
        return _default


def _to_numpy(x: Any) -> np.ndarray:
    # torch tensors (also on CUDA, also requiring grad) without importing torch here; dtypes
    # NumPy lacks (bfloat16) go through float32.
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):
        x = x.detach().cpu()
        if getattr(x, "dtype", None) is not None and str(x.dtype) == "torch.bfloat16":
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _aligned(a: np.ndarray) -> np.ndarray:
    # The native side reads elements at their strides: a view whose data or strides are not
    # multiples of the element size (a packed record field, a byte-offset view) is copied.
    return np.require(a, a.dtype, ["A"])


def _matrix(x: Any, what: str) -> np.ndarray:
    a = _to_numpy(x)
    if a.dtype != np.float32:
        if a.dtype.kind not in "fiu":
            raise TypeError(f"{what} must hold numbers, got dtype {a.dtype}")
        a = a.astype(np.float32)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (n, d), got shape {a.shape}")
    return _aligned(a)


def _labels(y: Any, what: str) -> np.ndarray:
    a = _to_numpy(y)
    if a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array (n,), got shape {a.shape}")
    if a.dtype == np.int64:
        return _aligned(a)
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got dtype {a.dtype}")
    if a.dtype == np.uint64 and int(a.max()) > _INT64_MAX:
        raise ValueError(f"{what} holds {int(a.max())}, beyond int64")
    return a.astype(np.int64)


def _exclusion(e: Any) -> Any:
    if e is None or isinstance(e, str):
        return e
    slots = _to_numpy(e)
    if slots.size and slots.dtype.kind not in "iu":
        raise TypeError("self_exclusion must be None, a string or one integer slot per query")
    if slots.ndim != 1:
        raise ValueError(f"self_exclusion slots must be 1-D (b,), got shape {slots.shape}")
    if slots.size and (int(slots.min()) < 0 or int(slots.max()) > 0xFFFFFFFF):
        raise ValueError("self_exclusion slots must lie in [0, 2**32)")
    return slots.astype(np.uint32)


def _rows(refs: Any) -> Any:
    """References of knn / pairwise_distances: None, a bank, or an (m, d) array."""
    if refs is None:
        return None
    if isinstance(refs, MemoryBank):
        return refs._inner
    return _matrix(refs, "refs")


def _refs(refs: Any, needs_embeddings: bool = True) -> Any:
    """References of the labelled operations: None, a bank, or (embeddings, labels)."""
    if refs is None:
        return None
    if isinstance(refs, MemoryBank):
        return refs._inner
    if not isinstance(refs, (tuple, list)) or len(refs) != 2:
        raise TypeError("refs must be None, a MemoryBank or a pair (ref_embeddings, ref_labels)")
    emb, labels = refs
    if emb is None:
        if needs_embeddings:
            raise ValueError("this operation needs the references' embeddings, got None")
        return (None, _labels(labels, "ref_labels"))
    return (_matrix(emb, "ref_embeddings"), _labels(labels, "ref_labels"))


def _triplet_args(ctx, embeddings, labels, refs, type_of_triplets, margin, distance, normalize,
                  self_exclusion):
    """The positional and keyword arguments of the native triplet functions."""
    args = (
        ctx,
        None if embeddings is None else _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs, needs_embeddings=type_of_triplets is not None),
    )
    kwargs = dict(
        type_of_triplets=type_of_triplets,
        margin=margin,
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )
    return args, kwargs


class MemoryBank:
    """A ring of ``capacity`` past embeddings ``(capacity, dim)`` and their labels, on the
    context's device (host memory on the CPU path), allocated once under the budget: PML's
    CrossBatchMemory storage, with no INT_MAX limit. Pass it as ``refs`` to any operation;
    nothing but 4-byte label ids is uploaded then.

    Example::

        bank = wml.MemoryBank(ctx, capacity=4096, dim=128)
        done = bank.enqueue(x, y)                       # the batch goes in first, as in PML
        t = wml.mine_triplets(ctx, x, y, bank, type_of_triplets="semihard",
                              self_exclusion=done.self_exclusion)
    """

    def __init__(self, ctx: Context, capacity: int, dim: int) -> None:
        self._inner = _native.MemoryBank(ctx, capacity, dim)

    @classmethod
    def load(cls, ctx: Context, path: str, capacity: int, dim: int) -> "MemoryBank":
        """Restores a bank written by :meth:`save` (``ValueError`` for a damaged, foreign or
        mismatched file; nothing is loaded then)."""
        bank = cls.__new__(cls)
        bank._inner = _native.MemoryBank.load(ctx, os.fspath(path), capacity, dim)
        return bank

    def save(self, path: str) -> int:
        """Writes the bank to ``path`` atomically (a crash leaves the old file or the new one,
        whole); returns the bytes written."""
        return self._inner.save(os.fspath(path))

    def enqueue(self, embeddings: Any, labels: Any, mask: Any = None) -> Enqueued:
        """Writes a batch ``(b, d)``, ``(b,)`` at the head, wrapping around. With ``mask``
        (``(b,)`` bool, MoCo style) only the masked rows go in and the others are the
        queries. A batch larger than the bank is a ``ValueError``."""
        m = None
        if mask is not None:
            m = _to_numpy(mask)
            if m.dtype != np.bool_:
                raise TypeError(f"mask must be boolean, got dtype {m.dtype}")
            # As bytes: a bool array may hold bytes other than 0 and 1 (a uint8 view), which
            # the native side reads as "nonzero is True", as NumPy does.
            m = np.ascontiguousarray(m).view(np.uint8)
        slots, rows, exclusion = self._inner.enqueue(
            _matrix(embeddings, "embeddings"), _labels(labels, "labels"), m
        )
        return Enqueued(slots, rows, exclusion)

    def snapshot(self) -> Tuple[np.ndarray, np.ndarray]:
        """The bank's rows ``(len, dim)`` float32 and labels ``(len,)`` int64, in slot order."""
        return self._inner.snapshot()

    def reset(self) -> None:
        """Empties the bank (its storage stays allocated)."""
        self._inner.reset()

    @property
    def capacity(self) -> int:
        return self._inner.capacity

    @property
    def dim(self) -> int:
        return self._inner.dim

    @property
    def head(self) -> int:
        """The slot the next row goes to."""
        return self._inner.head

    @property
    def is_filled(self) -> bool:
        """Whether the ring has wrapped (every slot holds a row)."""
        return self._inner.is_filled

    def __len__(self) -> int:
        return len(self._inner)

    def __repr__(self) -> str:
        return repr(self._inner)


def pairwise_distances(
    ctx: Context,
    queries: Any,
    refs: Any = None,
    *,
    distance: str = "euclidean",
    normalize: bool = True,
) -> np.ndarray:
    """Distances (or similarities) ``(q, n)`` between queries ``(q, d)`` and references
    ``(n, d)`` (``None``: the queries; or a :class:`MemoryBank`). ``distance`` is
    ``"euclidean"``, ``"squared_euclidean"``, ``"cosine"`` or ``"dot"``; ``normalize``
    L2-normalises the rows first (PML's ``normalize_embeddings``)."""
    return _native.pairwise_distances(
        ctx, _matrix(queries, "queries"), _rows(refs), distance=distance, normalize=normalize
    )


def knn(
    ctx: Context,
    queries: Any,
    refs: Any = None,
    *,
    k: int = 10,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> Knn:
    """The exact ``k`` best references of every query ``(q, d)``, any ``k`` up to the
    references a query can see (more is a ``ValueError``), under the budget.

    ``refs``: ``None`` (the queries; each query is then not its own neighbour), an ``(n, d)``
    array or a :class:`MemoryBank`. ``self_exclusion``: ``None``/``"auto"``, ``"none"``,
    ``"same_index"`` (PML's ``ref_includes_query``) or one reference slot per query."""
    indices, scores = _native.knn(
        ctx,
        _matrix(queries, "queries"),
        _rows(refs),
        k=k,
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )
    return Knn(indices, scores)


def mine_triplets(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    type_of_triplets: Optional[str] = None,
    margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> np.ndarray:
    """Triplets ``(t, 3)`` uint32 rows ``(anchor, positive, negative)`` in PML's order.

    ``type_of_triplets=None`` gives every valid triplet (PML's ``get_all_triplets_indices``;
    ``embeddings`` may be ``None``); ``"all"``, ``"hard"``, ``"semihard"`` or ``"easy"`` is
    PML's ``TripletMarginMiner(margin, type_of_triplets)``. ``refs``: ``None`` (the batch,
    ``a != p``), a :class:`MemoryBank`, or ``(ref_embeddings, ref_labels)``. Counts past
    2**31 work; for outputs too large to hold, use :func:`iter_triplets` or
    :func:`count_triplets`."""
    args, kwargs = _triplet_args(ctx, embeddings, labels, refs, type_of_triplets, margin, distance,
                                 normalize, self_exclusion)
    return _native.mine_triplets(*args, **kwargs)


def count_triplets(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    type_of_triplets: Optional[str] = None,
    margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> int:
    """How many triplets :func:`mine_triplets` would return, without writing them."""
    args, kwargs = _triplet_args(ctx, embeddings, labels, refs, type_of_triplets, margin, distance,
                                 normalize, self_exclusion)
    return _native.count_triplets(*args, **kwargs)


def iter_triplets(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    type_of_triplets: Optional[str] = None,
    margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    max_chunk_triplets: int = 1 << 20,
) -> TripletChunks:
    """The triplets of :func:`mine_triplets`, in the same order, as consecutive ``(t, 3)``
    chunks of at most ``max_chunk_triplets`` rows (raised to the number of references: one
    (anchor, positive) pair can yield that many), mined on a
    background thread one chunk ahead: memory stays bounded whatever the total. After the
    last chunk the iterator's ``count`` is the total; ``close()`` (or dropping it) stops the
    mining. ``refs`` here is ``None`` or ``(ref_embeddings, ref_labels)``."""
    if isinstance(refs, MemoryBank):
        raise TypeError("iter_triplets takes refs as arrays; snapshot() the bank first")
    args, kwargs = _triplet_args(ctx, embeddings, labels, refs, type_of_triplets, margin, distance,
                                 normalize, self_exclusion)
    return TripletChunks(*args, max_chunk_triplets=max_chunk_triplets, **kwargs)


def all_pairs(ctx: Context, labels: Any, refs: Any = None, *, self_exclusion: Any = None) -> Pairs:
    """Every positive and negative pair (PML's ``get_all_pairs_indices``), row-major.
    ``refs``: ``None``, a :class:`MemoryBank` or ``(ref_embeddings or None, ref_labels)``."""
    p, n = _native.all_pairs(
        ctx,
        _labels(labels, "labels"),
        _refs(refs, needs_embeddings=False),
        self_exclusion=_exclusion(self_exclusion),
    )
    return Pairs(p, n)


def pair_margin_pairs(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    pos_margin: float = 0.2,
    neg_margin: float = 0.8,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> Pairs:
    """PML's ``PairMarginMiner(pos_margin, neg_margin)``, row-major."""
    p, n = _native.pair_margin_pairs(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        pos_margin=pos_margin,
        neg_margin=neg_margin,
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )
    return Pairs(p, n)


def multi_similarity_pairs(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    epsilon: float = 0.1,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> Pairs:
    """PML's ``MultiSimilarityMiner(epsilon)``: per anchor in ascending value order, ties by
    the lower reference (PML's ``torch.sort`` leaves their order unspecified)."""
    p, n = _native.multi_similarity_pairs(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        epsilon=epsilon,
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )
    return Pairs(p, n)


def batch_easy_hard_pairs(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    pos_strategy: str = "easy",
    neg_strategy: str = "semihard",
    allowed_pos_range: Optional[Sequence[float]] = None,
    allowed_neg_range: Optional[Sequence[float]] = None,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> Pairs:
    """PML's ``BatchEasyHardMiner``: strategies ``"hard"``, ``"semihard"``, ``"easy"`` or
    ``"all"``, optional inclusive ranges ``(lo, hi)``; ties to the lower reference."""
    p, n = _native.batch_easy_hard_pairs(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        pos_strategy=pos_strategy,
        neg_strategy=neg_strategy,
        allowed_pos_range=None if allowed_pos_range is None else tuple(allowed_pos_range),
        allowed_neg_range=None if allowed_neg_range is None else tuple(allowed_neg_range),
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )
    return Pairs(p, n)


def batch_hard_triplets(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> np.ndarray:
    """PML's ``BatchHardMiner``: for each anchor with a positive and a negative, the farthest
    positive and the closest negative, ``(t, 3)`` uint32."""
    return _native.batch_hard_triplets(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )


def angular_triplets(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    angle: float = 20.0,
    self_exclusion: Any = None,
) -> np.ndarray:
    """PML's ``AngularMiner(angle)``: every valid triplet whose angle
    ``atan(|a - p| / (2 |n - (a + p)/2|))`` (torch's ``pairwise_distance`` on the raw
    embeddings) exceeds ``angle`` degrees, in ``(a, p, n)`` order, ``(t, 3)`` uint32."""
    return _native.angular_triplets(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        angle=float(angle),
        self_exclusion=_exclusion(self_exclusion),
    )


def distance_weighted_triplets(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
    seed: int = 0,
    self_exclusion: Any = None,
) -> np.ndarray:
    """PML's ``DistanceWeightedMiner(cutoff, nonzero_loss_cutoff)``: per anchor as many
    triplets as its label has references, a uniform positive and a negative drawn by PML's
    weights; ``(t, 3)`` uint32 in anchor order, a function of the inputs and ``seed``."""
    return _native.distance_weighted_triplets(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        cutoff=float(cutoff),
        nonzero_loss_cutoff=float(nonzero_loss_cutoff),
        seed=int(seed),
        self_exclusion=_exclusion(self_exclusion),
    )


def hdc_pairs(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    filter_percentage: float = 0.5,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
) -> Pairs:
    """PML's ``HDCMiner(filter_percentage)``: the ``ceil(filter_percentage * count)`` hardest
    positive and negative pairs, hardest first, ties in row-major order."""
    p, n = _native.hdc_pairs(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        filter_percentage=float(filter_percentage),
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
    )
    return Pairs(p, n)


def uniform_histogram_pairs(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    num_bins: int = 100,
    pos_per_bin: int = 10,
    neg_per_bin: int = 10,
    distance: str = "euclidean",
    normalize: bool = True,
    seed: int = 0,
    self_exclusion: Any = None,
) -> Pairs:
    """PML's ``UniformHistogramMiner(num_bins, pos_per_bin, neg_per_bin)``: each side's
    values in equal-width bins, that many pairs drawn with replacement from every non-empty
    bin, bin by bin; a function of the inputs and ``seed``."""
    p, n = _native.uniform_histogram_pairs(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        num_bins=int(num_bins),
        pos_per_bin=int(pos_per_bin),
        neg_per_bin=int(neg_per_bin),
        distance=distance,
        normalize=normalize,
        seed=int(seed),
        self_exclusion=_exclusion(self_exclusion),
    )
    return Pairs(p, n)


def accuracy(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    k: Union[None, str, int] = None,
    distance: str = "squared_euclidean",
    normalize: bool = False,
    self_exclusion: Any = None,
    avg_of_avgs: bool = False,
    include: Optional[Sequence[str]] = None,
    kmeans_seed: int = 1234,
    kmeans_iterations: int = 20,
) -> Accuracy:
    """PML's ``AccuracyCalculator`` metrics (precision_at_1, r_precision,
    mean_average_precision_at_r, mean_average_precision, mean_reciprocal_rank, NMI, AMI),
    computed in Rust end to end. ``include``: PML's metric names (default the five kNN
    metrics); NMI and AMI cluster the queries with :func:`kmeans` into as many clusters as
    there are query labels (``kmeans_seed``, ``kmeans_iterations``: PML asks Faiss for 20).
    ``k``: ``None``/``"all"`` (PML's default), ``"max_bin_count"`` or an int. ``refs=None``
    means the references are the queries, each not its own neighbour (PML's
    ``ref_includes_query``). The default ranking is squared L2 on raw embeddings, as PML's
    default Faiss index."""
    if isinstance(include, str):
        raise TypeError("include must be a sequence of metric names, not a string")
    out = _native.accuracy(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        k=k,
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
        avg_of_avgs=avg_of_avgs,
        include=None if include is None else [str(m) for m in include],
        kmeans_seed=kmeans_seed,
        kmeans_iterations=kmeans_iterations,
    )
    return Accuracy(out["metrics"], out["per_class"], out["lone_queries"], out["k"])


def kmeans(
    ctx: Context,
    points: Any,
    clusters: int,
    *,
    max_iterations: int = 20,
    tolerance: float = 0.0,
    seed: int = 1234,
    max_points_per_centroid: int = 256,
) -> Clustering:
    """k-means of ``points`` ``(n, d)`` as Faiss's ``Kmeans`` (what PML's
    ``AccuracyCalculator`` clusters with): ``clusters`` distinct random points as the first
    centroids, then up to ``max_iterations`` Lloyd updates (assignments by the library's exact
    top-1 search under the budget), Faiss's split of empty clusters, and Faiss's training
    sample of ``clusters · max_points_per_centroid`` points (0: every point). ``tolerance``
    stops once an update lowers the objective by less than that fraction (0: only at a fixed
    point). Every point is then assigned to the final centroids. The result is a function of
    the points and ``seed``."""
    out = _native.kmeans(
        ctx,
        _matrix(points, "points"),
        int(clusters),
        max_iterations=max_iterations,
        tolerance=tolerance,
        seed=seed,
        max_points_per_centroid=max_points_per_centroid,
    )
    return Clustering(*out)


def normalized_mutual_info(labels_true: Any, labels_pred: Any) -> float:
    """scikit-learn's ``normalized_mutual_info_score`` (arithmetic mean) of two integer
    labelings ``(n,)``."""
    return _native.normalized_mutual_info(
        _labels(labels_true, "labels_true"), _labels(labels_pred, "labels_pred")
    )


def adjusted_mutual_info(labels_true: Any, labels_pred: Any) -> float:
    """scikit-learn's ``adjusted_mutual_info_score`` (arithmetic mean) of two integer
    labelings ``(n,)``."""
    return _native.adjusted_mutual_info(
        _labels(labels_true, "labels_true"), _labels(labels_pred, "labels_pred")
    )


def triplet_margin_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    margin: float = 0.05,
    type_of_triplets: Optional[str] = None,
    miner_margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    smooth_loss: bool = False,
    swap: bool = False,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``TripletMarginLoss`` (``AvgNonZeroReducer``) over every valid triplet, or over
    those ``TripletMarginMiner(miner_margin, type_of_triplets)`` keeps, with its gradient, in
    memory linear in the batch and the references (no triplet list). ``refs``: ``None`` (the
    batch itself, a row never its own positive), a ``MemoryBank`` or ``(ref_embeddings,
    ref_labels)``; ``ref_grad`` also returns the references' gradient. ``swap``: PML's, a
    negative's distance the smaller of ``d(a, n)`` and ``d(p, n)`` (between the references'
    rows; for a similarity, the larger). ``count`` is the triplets with a positive loss, ``total`` the triplets considered."""
    loss, count, total, grad, rgrad = _native.triplet_margin_loss(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        margin=margin,
        type_of_triplets=type_of_triplets,
        miner_margin=miner_margin,
        distance=distance,
        normalize=normalize,
        smooth_loss=smooth_loss,
        swap=swap,
        self_exclusion=_exclusion(self_exclusion),
        ref_grad=ref_grad,
    )
    return Loss(loss, count, total, grad, rgrad)


def ntxent_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    temperature: float = 0.07,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``NTXentLoss(temperature)`` (every positive pair against its anchor's negatives,
    averaged over the positive pairs) with its gradient, in row blocks under the budget: the
    ``(b, m)`` similarity matrix never exists whole. ``count`` is the positive pairs,
    ``total`` the negative pairs; ``refs`` as in :func:`triplet_margin_loss`."""
    loss, count, total, grad, rgrad = _native.ntxent_loss(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        temperature=temperature,
        distance=distance,
        normalize=normalize,
        self_exclusion=_exclusion(self_exclusion),
        ref_grad=ref_grad,
    )
    return Loss(loss, count, total, grad, rgrad)


def multiple_negatives_ranking_loss(
    ctx: Context, anchors: Any, candidates: Any, *, scale: float = 20.0
) -> Loss:
    """sentence-transformers' ``MultipleNegativesRankingLoss``: anchor ``i``'s positive is
    ``candidates[i]``, every other candidate (the other positives, hard negatives, a bank's
    rows) a negative; the mean cross-entropy of ``scale * cos(anchor, candidates)``. ``grad``
    is the anchors' gradient, ``ref_grad`` the candidates'; the ``(b, c)`` matrix is never
    whole."""
    loss, count, total, grad, rgrad = _native.multiple_negatives_ranking_loss(
        ctx, _matrix(anchors, "anchors"), _matrix(candidates, "candidates"), scale=scale
    )
    return Loss(loss, count, total, grad, rgrad)


def _pair_loss(name: str, ctx: Context, embeddings: Any, labels: Any, refs: Any, **kw: Any) -> Loss:
    """One of PML's pair losses through ``_native.<name>``."""
    exclusion = _exclusion(kw.pop("self_exclusion"))
    return Loss(*getattr(_native, name)(
        ctx,
        _matrix(embeddings, "embeddings"),
        _labels(labels, "labels"),
        _refs(refs),
        self_exclusion=exclusion,
        **kw,
    ))


def contrastive_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``ContrastiveLoss(pos_margin, neg_margin)`` over every positive and negative pair
    (each group averaged over its nonzero pairs, the two means added) with its gradient, in
    row blocks under the budget. ``count`` is the nonzero pairs, ``total`` all the pairs;
    ``refs`` as in :func:`triplet_margin_loss`."""
    return _pair_loss(
        "contrastive_loss", ctx, embeddings, labels, refs, pos_margin=pos_margin,
        neg_margin=neg_margin, distance=distance, normalize=normalize,
        self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def multi_similarity_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``MultiSimilarityLoss(alpha, beta, base)`` over every pair, averaged over the
    batch, with its gradient; ``count`` is the batch's rows, ``total`` all the pairs."""
    return _pair_loss(
        "multi_similarity_loss", ctx, embeddings, labels, refs, alpha=alpha, beta=beta,
        base=base, distance=distance, normalize=normalize, self_exclusion=self_exclusion,
        ref_grad=ref_grad,
    )


def supcon_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    temperature: float = 0.1,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``SupConLoss(temperature)``, averaged over the anchors with a positive loss, with
    its gradient; ``count`` is those anchors, ``total`` all the pairs."""
    return _pair_loss(
        "supcon_loss", ctx, embeddings, labels, refs, temperature=temperature,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def circle_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    m: float = 0.4,
    gamma: float = 80.0,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``CircleLoss(m, gamma)`` (cosine similarity only), averaged over the anchors with
    a positive loss, with its gradient; ``count`` is those anchors, ``total`` all the pairs."""
    return _pair_loss(
        "circle_loss", ctx, embeddings, labels, refs, m=m, gamma=gamma, distance=distance,
        normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def nca_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    softmax_scale: float = 1.0,
    distance: str = "squared_euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``NCALoss(softmax_scale)``, averaged over the anchors whose same-class
    probability is not 0, with its gradient; ``count`` is those anchors, ``total`` all the
    pairs."""
    return _pair_loss(
        "nca_loss", ctx, embeddings, labels, refs, softmax_scale=softmax_scale,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def generalized_lifted_structure_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``GeneralizedLiftedStructureLoss(neg_margin, pos_margin)``, averaged over the
    batch, with its gradient; ``count`` is the batch's rows, ``total`` all the pairs."""
    return _pair_loss(
        "generalized_lifted_structure_loss", ctx, embeddings, labels, refs,
        pos_margin=pos_margin, neg_margin=neg_margin, distance=distance, normalize=normalize,
        self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def margin_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    margin: float = 0.2,
    nu: float = 0.0,
    beta: float = 1.2,
    learn_beta: bool = False,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``MarginLoss(margin, nu, beta, learn_beta)`` with one β, over every triplet
    without listing them, with its gradient (and ``beta_grad`` with ``learn_beta``);
    ``count`` is the nonzero terms (the divisor), ``total`` all the pairs."""
    return _pair_loss(
        "margin_loss", ctx, embeddings, labels, refs, margin=margin, nu=nu, beta=beta,
        learn_beta=learn_beta, distance=distance, normalize=normalize,
        self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def fast_ap_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    num_bins: int = 10,
    distance: str = "squared_euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``FastAPLoss(num_bins)`` (Euclidean or squared Euclidean on normalised rows),
    ``1 − AP`` from soft histograms, averaged over the anchors with a positive, with its
    gradient; ``count`` is those anchors, ``total`` all the pairs. References are the
    library's extension (PML's refuses them)."""
    return _pair_loss(
        "fast_ap_loss", ctx, embeddings, labels, refs, num_bins=num_bins, distance=distance,
        normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def lifted_structure_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    neg_margin: float = 1.0,
    pos_margin: float = 0.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``LiftedStructureLoss(neg_margin, pos_margin)``: per positive pair, the squared
    hinge of its distance plus the log-sum-exp over both rows' negatives, averaged over every
    positive pair, with its gradient (three passes over the rows, no pair-of-pairs mask);
    ``count`` is the positive pairs, ``total`` all the pairs."""
    return _pair_loss(
        "lifted_structure_loss", ctx, embeddings, labels, refs, neg_margin=neg_margin, pos_margin=pos_margin,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def histogram_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    n_bins: int = 100,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``HistogramLoss(n_bins)`` (cosine similarity, no references): the positive and
    negative pairs' soft histograms and the probability that a negative pair is more similar
    than a positive one, with its gradient; ``count`` is the pairs binned, ``total`` all the
    pairs."""
    return _pair_loss(
        "histogram_loss", ctx, embeddings, labels, refs, n_bins=n_bins,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def tuplet_margin_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    margin: float = 5.73,
    scale: float = 64.0,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``TupletMarginLoss(margin, scale)`` (cosine similarity, ``margin`` in degrees),
    averaged over every positive pair, with its gradient; ``count`` is the positive pairs,
    ``total`` all the pairs."""
    return _pair_loss(
        "tuplet_margin_loss", ctx, embeddings, labels, refs, margin=margin, scale=scale,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def intra_pair_variance_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    pos_eps: float = 0.01,
    neg_eps: float = 0.01,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``IntraPairVarianceLoss(pos_eps, neg_eps)``: each group's squared hinge
    around its own mean (the mean's gradient included), with its gradient; ``count`` is the
    pairs, ``total`` all the pairs."""
    return _pair_loss(
        "intra_pair_variance_loss", ctx, embeddings, labels, refs, pos_eps=pos_eps, neg_eps=neg_eps,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def ranked_list_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    margin: float = 0.4,
    tn: float = 1.0,
    imbalance: float = 0.5,
    alpha: Optional[float] = None,
    tp: float = 0.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``RankedListLoss(margin, Tn, imbalance, alpha, Tp)`` (here ``tn``, ``tp``;
    ``alpha=None`` is ``1 + margin / 2``), averaged over every anchor, with its gradient;
    ``count`` is the anchors, ``total`` all the pairs. References are the library's extension
    (PML's refuses them)."""
    return _pair_loss(
        "ranked_list_loss", ctx, embeddings, labels, refs, margin=margin, tn=tn, imbalance=imbalance, alpha=alpha, tp=tp,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def threshold_consistent_margin_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    lambda_plus: float = 1.0,
    lambda_minus: float = 1.0,
    margin_plus: float = 0.9,
    margin_minus: float = 0.5,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``ThresholdConsistentMarginLoss(lambda_plus, lambda_minus, margin_plus,
    margin_minus)`` (cosine similarity), with its gradient; ``count`` is the pairs past
    their margins, ``total`` all the pairs."""
    return _pair_loss(
        "threshold_consistent_margin_loss", ctx, embeddings, labels, refs, lambda_plus=lambda_plus, lambda_minus=lambda_minus, margin_plus=margin_plus, margin_minus=margin_minus,
        distance=distance, normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def pnp_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    b: float = 2.0,
    alpha: float = 1.0,
    anneal: float = 0.01,
    variant: str = "O",
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``PNPLoss(b, alpha, anneal, variant)`` (cosine similarity, no references): per
    anchor with a positive, the soft count of negatives ranked above each of its positives
    (and itself) through the variant's cost, averaged, with its gradient; ``count`` is those
    anchors, ``total`` all the pairs."""
    return _pair_loss(
        "pnp_loss", ctx, embeddings, labels, refs, b=b, alpha=alpha, anneal=anneal,
        variant=variant, distance=distance, normalize=normalize, self_exclusion=self_exclusion,
        ref_grad=ref_grad,
    )


def n_pairs_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    distance: str = "dot",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``NPairsLoss()`` (no references): each label's first row against every label's
    second row, the cross entropy with its own label's as the target, averaged, with its
    gradient; ``count`` is the pairs, ``total`` all the pairs."""
    return _pair_loss(
        "n_pairs_loss", ctx, embeddings, labels, refs, distance=distance, normalize=normalize,
        self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def instance_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    gamma: float = 64.0,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``InstanceLoss(gamma)`` (cosine similarity, no references): each row's cross
    entropy over the batch's similarities times ``gamma`` (its own column included), the
    target column its label's rank among the sorted distinct labels, averaged, with its
    gradient; ``count`` is the rows, ``total`` all the pairs."""
    return _pair_loss(
        "instance_loss", ctx, embeddings, labels, refs, gamma=gamma, distance=distance,
        normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def angular_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    alpha: float = 40.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``AngularLoss(alpha)`` (its default ``LpDistance()`` only; ``alpha`` in degrees):
    per positive pair, ``log(1 + Σ_n exp(4 tan²α (x̂_a + x̂_p)·r_n − 2 (1 + tan²α) x̂_a·x̂_p))``
    over the anchor's negatives (raw, as PML leaves them), averaged over the positive pairs,
    with its gradient; ``count`` is the positive pairs, ``total`` all the pairs."""
    return _pair_loss(
        "angular_loss", ctx, embeddings, labels, refs, alpha=alpha, distance=distance,
        normalize=normalize, self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def vicreg_loss(
    ctx: Context,
    embeddings: Any,
    ref_embeddings: Any = None,
    *,
    invariance_lambda: float = 25.0,
    variance_mu: float = 25.0,
    covariance_v: float = 1.0,
    eps: float = 1e-4,
) -> VicReg:
    """PML's ``VICRegLoss(invariance_lambda, variance_mu, covariance_v, eps)`` of two views
    ``(n, d)`` (``ref_embeddings`` ``None``: the first view again, as PML's ``ref_emb``),
    ``n >= 2``, with both views' gradients. The covariance term comes from the smaller of the
    ``(n, n)`` and ``(d, d)`` Gram matrices."""
    second = None if ref_embeddings is None else _matrix(ref_embeddings, "ref_embeddings")
    return VicReg(*_native.vicreg_loss(
        ctx, _matrix(embeddings, "embeddings"), second, invariance_lambda=invariance_lambda,
        variance_mu=variance_mu, covariance_v=covariance_v, eps=eps,
    ))


def snr_contrastive_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Loss:
    """PML's ``SignalToNoiseRatioContrastiveLoss(pos_margin, neg_margin)``: the contrastive
    loss on PML's ``SNRDistance`` (``var(q - r) / var(q)`` over each row's dimensions, the rows
    normalised first when ``normalize``), with its gradient; as :func:`contrastive_loss`."""
    return _pair_loss(
        "snr_contrastive_loss", ctx, embeddings, labels, refs, pos_margin=pos_margin,
        neg_margin=neg_margin, distance="squared_euclidean", normalize=normalize,
        self_exclusion=self_exclusion, ref_grad=ref_grad,
    )


def dynamic_soft_margin_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    refs: Any = None,
    *,
    min_val: float = -2.0,
    num_bins: int = 10,
    momentum: float = 0.01,
    histogram: Any = None,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: Any = None,
    ref_grad: bool = False,
) -> Tuple[Loss, np.ndarray]:
    """PML's ``DynamicSoftMarginLoss(min_val, num_bins, momentum)`` over every triplet (none
    listed), with its gradient, and the histogram PML keeps: ``histogram`` is the previous
    call's (``None``: a fresh loss's first call). Returns ``(Loss, histogram)``; ``count`` is
    the triplets. A triplet outside the histogram raises (PML: an index error)."""
    exclusion = _exclusion(self_exclusion)
    prior = None if histogram is None else [float(v) for v in np.asarray(histogram).ravel()]
    out = _native.dynamic_soft_margin_loss(
        ctx, _matrix(embeddings, "embeddings"), _labels(labels, "labels"), _refs(refs),
        min_val=min_val, num_bins=num_bins, momentum=momentum, histogram=prior,
        distance=distance, normalize=normalize, self_exclusion=exclusion, ref_grad=ref_grad,
    )
    return Loss(*out[:5]), np.asarray(out[5], dtype=np.float32)


def classifier_loss(
    ctx: Context,
    embeddings: Any,
    labels: Any,
    weights: Any,
    kind: str = "arcface",
    *,
    margin: Optional[float] = None,
    scale: Optional[float] = None,
    margin_grad: Optional[str] = None,
    centres: Optional[int] = None,
    temperature: Optional[float] = None,
    softmax_scale: Optional[float] = None,
    la: Optional[float] = None,
    gamma: Optional[float] = None,
    alpha: Optional[float] = None,
    sample_rate: Optional[float] = None,
    seed: Optional[int] = None,
) -> Classifier:
    """PML's loss with class weights ``kind`` (``"arcface"``, ``"sub_center_arcface"``,
    ``"cosface"``, ``"large_margin_softmax"``, ``"sphereface"``, ``"normalized_softmax"``,
    ``"proxy_nca"``, ``"proxy_anchor"``, ``"soft_triple"``) of ``embeddings`` ``(b, d)`` with class indices
    ``labels`` and ``weights`` in PML's layout (``(d, classes · centres)`` for ``W`` and
    ``fc``, ``(classes, d)`` for the ``proxies``), with both gradients, tiled over the
    classes (never a ``(b, classes)`` matrix). Each option ``None`` is PML's default;
    ``centres`` is ``sub_centers`` or ``centers_per_class``; ``margin`` is in degrees for
    ArcFace; ``margin_grad`` ``"pml"`` (through ``acos``) or ``"straight_through"``
    (insightface's). ProxyAnchor's ``count`` is the classes with a row in the batch.
    ``sample_rate`` and ``seed``: PartialFC's sampling, the softmax over the classes with a row
    and each other class with probability ``sample_rate``, drawn from ``seed`` and the class
    index (:func:`sampled_classes` lists them; not for ProxyAnchor). An option the loss does
    not take raises ``ValueError``."""
    return Classifier(*_native.classifier_loss(
        ctx, _matrix(embeddings, "embeddings"), _labels(labels, "labels"),
        _matrix(weights, "weights"), kind, margin=margin, scale=scale, margin_grad=margin_grad,
        centres=centres, temperature=temperature, softmax_scale=softmax_scale, la=la,
        gamma=gamma, alpha=alpha, sample_rate=sample_rate, seed=seed,
    ))


def sampled_classes(
    classes: int, labels: Any, sample_rate: float, seed: int, first_class: int = 0
) -> np.ndarray:
    """The classes that :func:`classifier_loss` with ``sample_rate`` and ``seed`` runs over
    among ``classes`` classes from ``first_class`` (a shard's range), for a batch with
    ``labels``: every class with a row, and those drawn, in order (int64)."""
    return _native.sampled_classes(
        int(classes), _labels(labels, "labels"), float(sample_rate), int(seed), int(first_class)
    )
