"""Drop-ins for pytorch-metric-learning (PML), with PML's constructors and call signatures,
computed by the library: torch tensors in and out on the caller's device (CUDA tensors go
through host memory until device sharing exists).

- :class:`KNN`: a ``knn_func`` for ``AccuracyCalculator`` (exact, any ``k``, under a budget).
- :class:`KMeans`: a ``kmeans_func`` for ``AccuracyCalculator`` (its NMI and AMI), Faiss's
  k-means on the library's search.
- :class:`TripletMarginMiner`, :class:`BatchHardMiner`, :class:`BatchEasyHardMiner`,
  :class:`MultiSimilarityMiner`, :class:`PairMarginMiner`, :class:`AngularMiner`,
  :class:`HDCMiner`: PML miners (subclasses of PML's ``BaseMiner``), usable wherever a PML
  miner is, PML's own ``CrossBatchMemory`` included, with PML's output (int64 index tuples,
  same order; ties, which PML leaves to torch, go to the lower index).
  :class:`DistanceWeightedMiner`, :class:`UniformHistogramMiner`: PML's random miners, with
  PML's distribution from the library's seeded generator (``seed=``).
- :class:`CrossBatchMemory`: PML's ``CrossBatchMemory(loss, embedding_size, memory_size,
  miner)``, its memory in the library's :class:`~wgpu_metric_learning.MemoryBank`: no INT_MAX
  limit and no ``B·M·M`` mask.
- :class:`TripletMarginLoss`, :class:`NTXentLoss`, :class:`ContrastiveLoss`,
  :class:`MultiSimilarityLoss`, :class:`SupConLoss`, :class:`CircleLoss`, :class:`NCALoss`,
  :class:`GeneralizedLiftedStructureLoss`, :class:`MarginLoss`, :class:`FastAPLoss`: PML's
  losses
  (subclasses of PML's own),
  whose value and gradient come from the library with no triplet list and no whole
  similarity matrix (``loss.backward()`` works); inside this module's ``CrossBatchMemory``
  they run against the memory directly. :class:`MultipleNegativesRankingLoss`:
  sentence-transformers' loss on embeddings ``(anchors, candidates)``.

Distances: the library computes PML's ``LpDistance(p=2)`` with ``power`` 1 or 2, normalised
or not, ``CosineSimilarity()`` and ``DotProductSimilarity()``. Any other distance object
(``SNRDistance``, other ``p`` or ``power``, ``BatchedDistance``, your own ``BaseDistance``
subclass) is accepted: the drop-in then runs PML's own code for it, with a warning, once per
class and distance, naming what runs where. Every drop-in takes ``backend`` (``"auto"``,
``"gpu"``, ``"cpu"``, …), ``budget`` (bytes) or a ready ``context``.

Arithmetic: on the native path rows are normalised as torch's ``F.normalize`` does (division
by the clamped norm), and calls with at most 25 rows on both sides compute each distance
directly, as ``torch.cdist`` does there for ``LpDistance`` (fused multiply-adds in order, as
torch's AVX2 and AVX-512 kernels sum short rows; similarities, which PML takes from
``torch.matmul``, summed the same way, which its BLAS matches on short rows). Ties by construction (symmetric angles, duplicated rows) are then
PML's ties. The wgpu path cannot promise it: WGSL's division is accurate to 2.5 ulp, so it
scales products by reciprocal norms, which can split such a tie by an ulp.

Example::

    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from wgpu_metric_learning.pml import KMeans, KNN, TripletMarginMiner

    calc = AccuracyCalculator(knn_func=KNN(), kmeans_func=KMeans(), k="max_bin_count")
    miner = TripletMarginMiner(margin=0.2, type_of_triplets="semihard")
    a, p, n = miner(embeddings, labels)
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

try:
    import torch
    from pytorch_metric_learning import distances as pml_distances
    from pytorch_metric_learning import losses as pml_losses
    from pytorch_metric_learning import reducers as pml_reducers
    from pytorch_metric_learning import miners as pml_miners
    from pytorch_metric_learning.losses import CrossBatchMemory as _PmlCrossBatchMemory
    from pytorch_metric_learning.utils import common_functions as c_f
    from pytorch_metric_learning.utils import loss_and_miner_utils as lmu
    from pytorch_metric_learning.utils.inference import CustomKNN as _PmlCustomKNN
    from pytorch_metric_learning.utils.module_with_records import ModuleWithRecords
except ImportError as missing:
    raise ImportError(
        "wgpu_metric_learning.pml needs torch and pytorch-metric-learning "
        "(pip install torch pytorch-metric-learning)"
    ) from missing

from . import (
    Context,
    MemoryBank,
    _native,
)
from . import _labels as _np_labels
from ._torch import _OnContext, _emb, _loss_tensor, _shared_context

__all__ = [
    "KMeans",
    "KNN",
    "BatchEasyHardMiner",
    "AngularLoss",
    "AngularMiner",
    "ArcFaceLoss",
    "CosFaceLoss",
    "LargeMarginSoftmaxLoss",
    "NormalizedSoftmaxLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "SoftTripleLoss",
    "SphereFaceLoss",
    "SubCenterArcFaceLoss",
    "BatchHardMiner",
    "DistanceWeightedMiner",
    "HDCMiner",
    "UniformHistogramMiner",
    "CircleLoss",
    "ContrastiveLoss",
    "CrossBatchMemory",
    "DynamicSoftMarginLoss",
    "FastAPLoss",
    "GeneralizedLiftedStructureLoss",
    "HistogramLoss",
    "InstanceLoss",
    "IntraPairVarianceLoss",
    "LiftedStructureLoss",
    "MarginLoss",
    "MultiSimilarityLoss",
    "MultiSimilarityMiner",
    "NCALoss",
    "MultipleNegativesRankingLoss",
    "NPairsLoss",
    "NTXentLoss",
    "PairMarginMiner",
    "PNPLoss",
    "RankedListLoss",
    "SignalToNoiseRatioContrastiveLoss",
    "SupConLoss",
    "ThresholdConsistentMarginLoss",
    "TripletMarginLoss",
    "TripletMarginMiner",
    "TupletMarginLoss",
    "VICRegLoss",
]

def library_distance(distance: Any) -> Optional[Tuple[str, bool]]:
    """``(distance name, normalize)`` for a PML distance object the library computes, else
    ``None`` (the drop-in then runs PML's own code)."""
    try:
        return distance_args(distance)
    except ValueError:
        return None


_warned: set = set()
_warned_lock = threading.Lock()


def _warn_fallback(who: Any, distance: Any) -> None:
    """Says once per (drop-in class, distance class) that PML's own code runs."""
    key = (type(who).__name__, type(distance).__name__)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    settings = ", ".join(
        f"{name}={getattr(distance, name)!r}"
        for name in ("p", "power", "normalize_embeddings")
        if hasattr(distance, name)
    )
    warnings.warn(
        f"{key[0]} with {key[1]}({settings}): wgpu_metric_learning has no kernel for this "
        "distance, "
        "so PML's own code runs it (in torch, on the tensors' device); LpDistance(p=2, "
        "power=1 or 2), CosineSimilarity() and DotProductSimilarity() run in the library",
        stacklevel=3,
    )


def distance_args(distance: Any) -> Tuple[str, bool]:
    """``(distance name, normalize)`` for a PML distance object; ``ValueError`` for one the
    library does not compute (see :func:`library_distance`)."""
    kind = type(distance)
    if kind is pml_distances.CosineSimilarity:
        name = "cosine"
    elif kind is pml_distances.DotProductSimilarity:
        name = "dot"
    elif kind is pml_distances.LpDistance:
        if distance.p != 2:
            raise ValueError(f"LpDistance(p={distance.p}) is not supported: only p=2")
        if distance.power not in (1, 2):
            raise ValueError(f"LpDistance(power={distance.power}) is not supported: 1 or 2")
        name = "euclidean" if distance.power == 1 else "squared_euclidean"
        return name, bool(distance.normalize_embeddings)
    else:
        raise ValueError(
            f"{kind.__name__} is not supported: use LpDistance(p=2, power=1 or 2), "
            "CosineSimilarity() or DotProductSimilarity()"
        )
    if distance.power != 1:
        raise ValueError(f"{kind.__name__}(power={distance.power}) is not supported: only 1")
    return name, bool(distance.normalize_embeddings)


def _lab(y: torch.Tensor, what: str) -> np.ndarray:
    return _np_labels(y.detach().cpu(), what)


def _column(rows: np.ndarray, j: int, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(rows[:, j].astype(np.int64)).to(device)


def _triplet_tuple(rows: np.ndarray, device: torch.device):
    return tuple(_column(rows, j, device) for j in range(3))


def _pair_tuple(pos: np.ndarray, neg: np.ndarray, device: torch.device):
    return (
        _column(pos, 0, device),
        _column(pos, 1, device),
        _column(neg, 0, device),
        _column(neg, 1, device),
    )


class KNN(_OnContext):
    """A ``knn_func`` for PML's ``AccuracyCalculator``: ``knn(query, k, reference,
    ref_includes_query)`` returns ``(distances, indices)`` ``(q, k)`` (float32, int64) on the
    query's device, best first, with PML's self-exclusion (query ``i`` is reference ``i``).

    ``distance=None`` ranks by squared L2 on the raw embeddings, as PML's default
    ``FaissKNN`` (``IndexFlatL2``); a PML distance object ranks by it (one the library does
    not compute runs PML's ``CustomKNN(distance)``). Exact for any ``k``; the search is tiled
    under ``budget`` bytes of device memory. A ``k`` beyond the references a query can see is
    a ``ValueError`` (Faiss pads with index ``-1``). Ties: the lower index first (torch's
    ``topk`` leaves their order unspecified)."""

    def __init__(
        self,
        distance: Any = None,
        budget: Optional[int] = None,
        backend: str = "auto",
        context: Optional[Context] = None,
    ) -> None:
        if distance is None:
            self.distance_args: Optional[Tuple[str, bool]] = ("squared_euclidean", False)
        else:
            self.distance_args = library_distance(distance)
        self.distance = distance
        self._set_context(context, backend, budget)

    def __call__(
        self,
        query: torch.Tensor,
        k: int,
        reference: Optional[torch.Tensor] = None,
        ref_includes_query: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.distance_args is None:
            _warn_fallback(self, self.distance)
            ref = query if reference is None else reference
            return _PmlCustomKNN(self.distance)(query, k, ref, ref_includes_query)
        q = _emb(query, "query")
        r = q if reference is None or reference is query else _emb(reference, "reference")
        name, normalize = self.distance_args
        indices, scores = _native.knn(
            self.context,
            q,
            r,
            k=int(k),
            distance=name,
            normalize=normalize,
            self_exclusion="same_index" if ref_includes_query else "none",
        )
        idx = indices.astype(np.int64)
        device = query.device
        return torch.from_numpy(scores).to(device), torch.from_numpy(idx).to(device)


class KMeans(_OnContext):
    """A ``kmeans_func`` for PML's ``AccuracyCalculator``: ``kmeans(x, nmb_clusters)`` returns
    each row's cluster ``(n,)`` (int64, on ``x``'s device), as PML's ``FaissKMeans`` does.

    Faiss's ``Kmeans`` with PML's settings by default: ``niter=20`` updates from ``nmb_clusters``
    random points, Faiss's split of empty clusters, its training sample of
    ``nmb_clusters · max_points_per_centroid`` points, and every row assigned to the final
    centroids by the library's exact top-1 search under ``budget``. ``seed`` fixes the
    clustering (Faiss's default seed, 1234; Faiss draws other random numbers from it, so the
    clusters are not Faiss's own, only as good)."""

    def __init__(
        self,
        niter: int = 20,
        seed: int = 1234,
        max_points_per_centroid: int = 256,
        tolerance: float = 0.0,
        budget: Optional[int] = None,
        backend: str = "auto",
        context: Optional[Context] = None,
    ) -> None:
        self.niter = int(niter)
        self.seed = int(seed)
        self.max_points_per_centroid = int(max_points_per_centroid)
        self.tolerance = float(tolerance)
        self._set_context(context, backend, budget)

    def __call__(self, x: torch.Tensor, nmb_clusters: int) -> torch.Tensor:
        clusters = _native.kmeans(
            self.context,
            _emb(x, "x"),
            int(nmb_clusters),
            max_iterations=self.niter,
            tolerance=self.tolerance,
            seed=self.seed,
            max_points_per_centroid=self.max_points_per_centroid,
        )[1]
        return torch.from_numpy(clusters.astype(np.int64)).to(x.device)


class _LibraryMiner(_OnContext):
    """Mixed in before a PML miner class: its ``mine`` runs in the library, or PML's own
    ``mine`` where the library does not compute the distance. PML's self-comparison rule is
    kept: a query is not its own reference only when ``ref_labels is labels`` (no references
    given, or the very same tensor)."""

    # Whether a memory slot holding the anchor itself changes what else the miner selects
    # (per-anchor extremes and thresholds, global counts or value ranges, numbers of draws):
    # then inside CrossBatchMemory it must be mined as PML mines it (the slot included, the
    # self pairs removed afterwards), not excluded beforehand.
    _selects_per_anchor = False

    def __init__(
        self,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_context(context, backend, budget)
        if library_distance(self.distance) is None:
            _warn_fallback(self, self.distance)

    def _library_runs(self) -> bool:
        """Whether the library mines with the current settings (PML's code otherwise)."""
        return library_distance(self.distance) is not None

    def mine(self, embeddings, labels, ref_emb, ref_labels):
        if not self._library_runs():
            if library_distance(self.distance) is None:
                _warn_fallback(self, self.distance)
            return super().mine(embeddings, labels, ref_emb, ref_labels)  # type: ignore[misc]
        q = _emb(embeddings, "embeddings")
        y = _lab(labels, "labels")
        if ref_labels is labels and ref_emb is embeddings:
            refs, exclusion = None, None
        else:
            r = q if ref_emb is embeddings else _emb(ref_emb, "ref_emb")
            refs = (r, _lab(ref_labels, "ref_labels"))
            exclusion = "same_index" if ref_labels is labels else "none"
        return self._mine(q, y, refs, exclusion, embeddings.device)

    def mine_bank(self, embeddings, labels, bank: MemoryBank, exclusion: Any):
        """Mines the queries against a bank of the same context (CrossBatchMemory)."""
        self.reset_stats()
        with torch.no_grad():
            out = self._mine(
                _emb(embeddings, "embeddings"),
                _lab(labels, "labels"),
                bank._inner,
                exclusion,
                embeddings.device,
            )
        self.output_assertion(out)
        return out

    def _distance_kw(self) -> Dict[str, Any]:
        name, normalize = distance_args(self.distance)
        return {"distance": name, "normalize": normalize}

    def _mine(self, q, y, refs, exclusion, device):
        raise NotImplementedError


class TripletMarginMiner(_LibraryMiner, pml_miners.TripletMarginMiner):
    """PML's ``TripletMarginMiner(margin=0.2, type_of_triplets="all")``: every valid triplet
    whose margin ``d(a,n) - d(a,p)`` (similarities: ``s(a,p) - s(a,n)``) is ``<= margin``
    (``"hard"``: also ``<= 0``; ``"semihard"``: also ``> 0``) or, for ``"easy"``,
    ``> margin``; in PML's ``(a, p, n)`` order. An unknown ``type_of_triplets`` is a
    ``ValueError`` (PML treats it as ``"all"``)."""

    def __init__(self, margin: float = 0.2, type_of_triplets: str = "all", **kwargs: Any) -> None:
        if type_of_triplets not in ("all", "hard", "semihard", "easy"):
            raise ValueError(
                "type_of_triplets must be 'all', 'hard', 'semihard' or 'easy', "
                f"got {type_of_triplets!r}"
            )
        super().__init__(margin=margin, type_of_triplets=type_of_triplets, **kwargs)

    def _mine(self, q, y, refs, exclusion, device):
        rows = _native.mine_triplets(
            self.context,
            q,
            y,
            refs,
            type_of_triplets=self.type_of_triplets,
            margin=float(self.margin),
            self_exclusion=exclusion,
            **self._distance_kw(),
        )
        return _triplet_tuple(rows, device)


class BatchHardMiner(_LibraryMiner, pml_miners.BatchHardMiner):
    """PML's ``BatchHardMiner()``: for each anchor with a positive and a negative, the
    hardest positive and the hardest negative, ``(a, p, n)``."""

    _selects_per_anchor = True

    def _mine(self, q, y, refs, exclusion, device):
        rows = _native.batch_hard_triplets(
            self.context, q, y, refs, self_exclusion=exclusion, **self._distance_kw()
        )
        return _triplet_tuple(rows, device)


class BatchEasyHardMiner(_LibraryMiner, pml_miners.BatchEasyHardMiner):
    """PML's ``BatchEasyHardMiner(pos_strategy="easy", neg_strategy="semihard",
    allowed_pos_range=None, allowed_neg_range=None)``, returning ``(a1, p, a2, n)``."""

    _selects_per_anchor = True

    def _mine(self, q, y, refs, exclusion, device):
        pos, neg = _native.batch_easy_hard_pairs(
            self.context,
            q,
            y,
            refs,
            pos_strategy=self.pos_strategy,
            neg_strategy=self.neg_strategy,
            allowed_pos_range=None if self.allowed_pos_range is None else tuple(self.allowed_pos_range),
            allowed_neg_range=None if self.allowed_neg_range is None else tuple(self.allowed_neg_range),
            self_exclusion=exclusion,
            **self._distance_kw(),
        )
        return _pair_tuple(pos, neg, device)


class MultiSimilarityMiner(_LibraryMiner, pml_miners.MultiSimilarityMiner):
    """PML's ``MultiSimilarityMiner(epsilon=0.1)`` (default distance ``CosineSimilarity()``),
    returning ``(a1, p, a2, n)``; within an anchor, ties in value go to the lower index."""

    _selects_per_anchor = True

    def __init__(self, epsilon: float = 0.1, **kwargs: Any) -> None:
        super().__init__(epsilon=epsilon, **kwargs)

    def _mine(self, q, y, refs, exclusion, device):
        pos, neg = _native.multi_similarity_pairs(
            self.context,
            q,
            y,
            refs,
            epsilon=float(self.epsilon),
            self_exclusion=exclusion,
            **self._distance_kw(),
        )
        return _pair_tuple(pos, neg, device)


class PairMarginMiner(_LibraryMiner, pml_miners.PairMarginMiner):
    """PML's ``PairMarginMiner(pos_margin=0.2, neg_margin=0.8)``: positives farther than
    ``pos_margin``, negatives closer than ``neg_margin`` (mirrored for similarities),
    returning ``(a1, p, a2, n)``."""

    def __init__(self, pos_margin: float = 0.2, neg_margin: float = 0.8, **kwargs: Any) -> None:
        super().__init__(pos_margin=pos_margin, neg_margin=neg_margin, **kwargs)

    def _mine(self, q, y, refs, exclusion, device):
        pos, neg = _native.pair_margin_pairs(
            self.context,
            q,
            y,
            refs,
            pos_margin=float(self.pos_margin),
            neg_margin=float(self.neg_margin),
            self_exclusion=exclusion,
            **self._distance_kw(),
        )
        return _pair_tuple(pos, neg, device)


class AngularMiner(_LibraryMiner, pml_miners.AngularMiner):
    """PML's ``AngularMiner(angle=20)``: every valid triplet whose angle
    ``atan(|a - p| / (2 |n - (a + p)/2|))`` exceeds ``angle`` degrees (stored in radians, as
    PML stores it), returning ``(a, p, n)`` in PML's order. As in PML the distance must be
    the default ``LpDistance()``, and the angle is measured on the raw embeddings."""

    def __init__(self, angle: float = 20, **kwargs: Any) -> None:
        super().__init__(angle=angle, **kwargs)

    def _mine(self, q, y, refs, exclusion, device):
        rows = _native.angular_triplets(
            self.context, q, y, refs, angle=float(np.degrees(self.angle)), self_exclusion=exclusion
        )
        return _triplet_tuple(rows, device)


class HDCMiner(_LibraryMiner, pml_miners.HDCMiner):
    """PML's ``HDCMiner(filter_percentage=0.5)``: the ``ceil(filter_percentage * count)``
    hardest positive and negative pairs of the batch, hardest first, returning
    ``(a1, p, a2, n)``. Ties at the cut are ours to break: equal values come in row-major
    order (lower anchor, then lower reference) and the first of them make the cut. torch's
    ``topk`` leaves that order unspecified and is not row-major (on sklearn's digits PML
    keeps pair (83, 43) and drops (43, 83) at an exact tie). After ``set_idx_externally``
    PML's own code runs, on the pairs given."""

    _selects_per_anchor = True

    def __init__(self, filter_percentage: float = 0.5, **kwargs: Any) -> None:
        super().__init__(filter_percentage=filter_percentage, **kwargs)

    def _library_runs(self) -> bool:
        return super()._library_runs() and not self.was_set_externally

    def _mine(self, q, y, refs, exclusion, device):
        pos, neg = _native.hdc_pairs(
            self.context,
            q,
            y,
            refs,
            filter_percentage=float(self.filter_percentage),
            self_exclusion=exclusion,
            **self._distance_kw(),
        )
        return _pair_tuple(pos, neg, device)


class _SeededMiner(_LibraryMiner):
    """A miner that draws at random: ``seed`` (default: drawn from torch's generator at each
    call, so that ``torch.manual_seed`` makes a run repeatable as with PML) fixes its draws."""

    _selects_per_anchor = True

    def __init__(self, seed: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = seed

    def _next_seed(self) -> int:
        if self.seed is not None:
            return int(self.seed)
        return int(torch.randint(0, 2**62, (1,)).item())


class DistanceWeightedMiner(_SeededMiner, pml_miners.DistanceWeightedMiner):
    """PML's ``DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)``: triplets with a
    uniform positive and a negative drawn by PML's distance weights, as many per anchor as
    PML draws, returning ``(a, p, n)`` with PML's distribution (the library's generator, so
    not torch's numbers; anchors ascending, where PML groups them by label). As in PML the
    distance must be the default ``LpDistance()``."""

    def __init__(self, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4, **kwargs: Any) -> None:
        super().__init__(cutoff=cutoff, nonzero_loss_cutoff=nonzero_loss_cutoff, **kwargs)

    def _mine(self, q, y, refs, exclusion, device):
        rows = _native.distance_weighted_triplets(
            self.context,
            q,
            y,
            refs,
            cutoff=self.cutoff,
            nonzero_loss_cutoff=self.nonzero_loss_cutoff,
            seed=self._next_seed(),
            self_exclusion=exclusion,
        )
        return _triplet_tuple(rows, device)


class UniformHistogramMiner(_SeededMiner, pml_miners.UniformHistogramMiner):
    """PML's ``UniformHistogramMiner(num_bins=100, pos_per_bin=10, neg_per_bin=10)``: each
    side's pair values in ``num_bins`` equal-width bins, that many pairs drawn with
    replacement from each non-empty bin, returning ``(a1, p, a2, n)`` bin by bin with PML's
    distribution (the library's generator, not torch's numbers)."""

    def __init__(self, num_bins: int = 100, pos_per_bin: int = 10, neg_per_bin: int = 10, **kwargs: Any) -> None:
        super().__init__(num_bins=num_bins, pos_per_bin=pos_per_bin, neg_per_bin=neg_per_bin, **kwargs)

    def _mine(self, q, y, refs, exclusion, device):
        pos, neg = _native.uniform_histogram_pairs(
            self.context,
            q,
            y,
            refs,
            num_bins=int(self.num_bins),
            pos_per_bin=int(self.pos_per_bin),
            neg_per_bin=int(self.neg_per_bin),
            seed=self._next_seed(),
            self_exclusion=exclusion,
            **self._distance_kw(),
        )
        return _pair_tuple(pos, neg, device)


class CrossBatchMemory(ModuleWithRecords):
    """PML's ``CrossBatchMemory(loss, embedding_size, memory_size=1024, miner=None)``: a ring
    of past embeddings that serve as the references of ``loss``. Its memory is the library's
    :class:`~wgpu_metric_learning.MemoryBank`; with one of this module's miners (or none:
    all pairs) mining runs against the bank directly, with no INT_MAX limit and no
    ``B·M·M`` mask; any other PML miner is called as PML calls it.

    ``forward(embeddings, labels, indices_tuple=None, enqueue_mask=None)`` returns the loss
    as PML's does: the batch (or its masked rows) is enqueued first, then the loss compares
    the batch (or its unmasked rows) with the memory, a row never paired with its own slot.
    The miners that pick per anchor (``BatchHardMiner``, ``BatchEasyHardMiner``,
    ``MultiSimilarityMiner``) mine the whole memory, the anchor's own slot included, and the
    self pairs are removed afterwards, as PML does. With one of this module's miners or
    losses, its context is the memory's (``backend`` and ``budget`` are then the miner's or
    the loss's); this module's ``TripletMarginLoss`` and ``NTXentLoss`` then run against the
    memory directly, with no pair or triplet list.

    PML's attribute surface: ``embedding_memory`` and ``label_memory`` (the whole ring,
    ``(memory_size, embedding_size)`` and ``(memory_size,)``, in the dtype and on the device
    of the last batch, as PML's buffers) can be assigned, moved and cast, and are in
    ``state_dict``; so can ``queue_idx``, ``has_been_filled`` and ``curr_batch_idx``;
    ``add_to_memory``, ``reset_queue`` and ``create_indices_tuple`` are PML's. Differences,
    on purpose: the memory holds float32 (an assigned memory is rounded to it, as the library
    computes in float32); a batch larger than the memory is a ``ValueError`` (PML: an
    ``AssertionError``, or duplicate slots with a mask); assigning ``memory_size`` makes a
    new, empty memory of that size at once (PML keeps its old buffers until ``reset_queue()``
    and indexes past them before); with no miner, ``TripletMarginMiner`` or
    ``PairMarginMiner`` a batch of one row never keeps its own slot as a positive (PML's
    ``remove_self_comparisons`` keeps it)."""

    def __init__(
        self,
        loss: torch.nn.Module,
        embedding_size: int,
        memory_size: int = 1024,
        miner: Any = None,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _PmlCrossBatchMemory.check_loss_support(type(loss).__name__)
        self.loss = loss
        self.miner = miner
        self.embedding_size = embedding_size
        if _library_miner(miner):
            ctx = miner.context if context is None else context
            if miner.context is not ctx:
                raise ValueError("the miner and the CrossBatchMemory must share one context")
        elif isinstance(loss, _LibraryLoss) and context is None:
            ctx = loss.context
        else:
            ctx = _shared_context(context, backend, budget)
        if isinstance(loss, _LibraryLoss) and loss.context is not ctx:
            raise ValueError("the loss and the CrossBatchMemory must share one context")
        self.context = ctx
        self.memory_size = memory_size  # makes the bank
        self.curr_batch_idx: Optional[torch.Tensor] = None
        self.add_to_recordable_attributes(
            list_of_names=["embedding_size", "memory_size", "queue_idx"], is_stat=False
        )

    @staticmethod
    def supported_losses():
        return _PmlCrossBatchMemory.supported_losses()

    @classmethod
    def check_loss_support(cls, loss_name):
        _PmlCrossBatchMemory.check_loss_support(loss_name)

    # The ring's state -----------------------------------------------------------------

    @property
    def memory_size(self) -> int:
        return self._memory_size

    @memory_size.setter
    def memory_size(self, size: int) -> None:
        size = int(size)
        if size <= 0:
            raise ValueError(f"memory_size must be positive, got {size}")
        self._memory_size = size
        self.bank = MemoryBank(self.context, size, self.embedding_size)
        self.reset_queue()

    @property
    def queue_idx(self) -> int:
        """The slot the next row goes to."""
        return self.bank.head

    @queue_idx.setter
    def queue_idx(self, slot: int) -> None:
        slot = int(slot)
        if not 0 <= slot < self.memory_size:
            raise ValueError(f"queue_idx must be in [0, {self.memory_size}), got {slot}")
        self._restore(*self._ring(), slot, self.has_been_filled)

    @property
    def has_been_filled(self) -> bool:
        return self.bank.is_filled

    @has_been_filled.setter
    def has_been_filled(self, filled: bool) -> None:
        self._restore(*self._ring(), self.queue_idx, bool(filled))

    def reset_queue(self) -> None:
        """Empties the memory: zeros, float32 and int64 on the CPU, as PML's new buffers."""
        self.bank.reset()
        self._unwritten: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._memory_like = (torch.device("cpu"), torch.float32, torch.int64)

    @property
    def embedding_memory(self) -> torch.Tensor:
        """The ring ``(memory_size, embedding_size)`` in slot order (a copy; assign to change
        it), zeros where nothing was written yet, as PML's buffer of the same name."""
        device, dtype, _ = self._memory_like
        return torch.from_numpy(self._ring()[0]).to(device=device, dtype=dtype)

    @embedding_memory.setter
    def embedding_memory(self, value: torch.Tensor) -> None:
        rows = self._assigned(value, (self.memory_size, self.embedding_size), "embedding_memory")
        self._restore(rows, self._ring()[1], self.queue_idx, self.has_been_filled)
        _, _, label_dtype = self._memory_like
        self._memory_like = (value.device, value.dtype, label_dtype)

    @property
    def label_memory(self) -> torch.Tensor:
        """The ring's labels ``(memory_size,)`` (a copy; assign to change them), zeros where
        nothing was written yet."""
        device, _, label_dtype = self._memory_like
        return torch.from_numpy(self._ring()[1]).to(device=device, dtype=label_dtype)

    @label_memory.setter
    def label_memory(self, value: torch.Tensor) -> None:
        labels = self._assigned(value, (self.memory_size,), "label_memory")
        if not np.all(labels == np.round(labels)):
            raise ValueError("label_memory must hold whole numbers (class labels)")
        self._restore(self._ring()[0], labels.astype(np.int64), self.queue_idx, self.has_been_filled)
        device, dtype, _ = self._memory_like
        self._memory_like = (device, dtype, value.dtype)

    @staticmethod
    def _assigned(value: Any, shape: Tuple[int, ...], what: str) -> np.ndarray:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
        if tuple(value.shape) != shape:
            raise ValueError(f"{what} must have shape {shape}, got {tuple(value.shape)}")
        out = value.detach().to("cpu")
        if what == "label_memory":
            return out.to(torch.float64).numpy() if out.is_floating_point() else out.numpy()
        return np.ascontiguousarray(out.to(torch.float32).numpy())

    def _ring(self) -> Tuple[np.ndarray, np.ndarray]:
        """The whole ring ``(memory_size, d)`` float32 and ``(memory_size,)`` int64: the
        bank's rows, then what the slots not yet written hold (zeros, or an assignment's)."""
        emb, lab = self.bank.snapshot()
        n = len(emb)
        if self._unwritten is None:
            full_emb = np.zeros((self.memory_size, self.embedding_size), np.float32)
            full_lab = np.zeros(self.memory_size, np.int64)
        else:
            full_emb, full_lab = self._unwritten[0].copy(), self._unwritten[1].copy()
        full_emb[:n], full_lab[:n] = emb, lab
        return full_emb, full_lab

    def _restore(self, emb: np.ndarray, lab: np.ndarray, head: int, filled: bool) -> None:
        """Makes the bank hold the ring ``emb``/``lab`` with ``head`` and ``filled`` (PML's
        ``queue_idx`` and ``has_been_filled``), by rewriting it from empty."""
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        lab = np.ascontiguousarray(lab, dtype=np.int64)
        self.bank.reset()
        if filled:
            # Every slot in order (the ring wraps to 0 and is filled), then up to the head.
            self.bank.enqueue(emb, lab)
            if head:
                self.bank.enqueue(emb[:head], lab[:head])
            self._unwritten = None
        else:
            if head:
                self.bank.enqueue(emb[:head], lab[:head])
            self._unwritten = (emb, lab)

    def _apply(self, fn, *args, **kwargs):
        """``.to()``, ``.cuda()``, ``.type()``, ``.half()``, … move and cast the memory as
        they would PML's buffers (the bank keeps float32; see the class docs)."""
        out = super()._apply(fn, *args, **kwargs)
        device, dtype, label_dtype = self._memory_like
        emb = fn(torch.empty(0, device=device, dtype=dtype))
        lab = fn(torch.empty(0, device=device, dtype=label_dtype))
        self._memory_like = (emb.device, emb.dtype, lab.dtype)
        return out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "embedding_memory"] = self.embedding_memory
        destination[prefix + "label_memory"] = self.label_memory

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        # PML copies into its buffers, which keep their device and dtype: so do these.
        like = self._memory_like
        for name in ("embedding_memory", "label_memory"):
            key = prefix + name
            if key in unexpected_keys:
                unexpected_keys.remove(key)
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            try:
                setattr(self, name, state_dict[key])
            except (TypeError, ValueError) as e:
                error_msgs.append(f"{key}: {e}")
        self._memory_like = like

    # PML's methods ----------------------------------------------------------------------

    def add_to_memory(self, embeddings, labels, batch_size):
        """Writes the batch at ``queue_idx`` (PML's method: ``batch_size`` is its length)."""
        if int(batch_size) != len(embeddings):
            raise ValueError(f"batch_size {batch_size} is not the batch's {len(embeddings)} rows")
        done = self.bank.enqueue(_emb(embeddings, "embeddings"), _lab(labels, "labels"))
        if self.has_been_filled:
            self._unwritten = None
        self.curr_batch_idx = torch.from_numpy(done.slots.astype(np.int64)).to(labels.device)

    def forward(self, embeddings, labels, indices_tuple=None, enqueue_mask=None):
        if indices_tuple is not None and enqueue_mask is not None:
            raise ValueError("indices_tuple and enqueue_mask are mutually exclusive")
        if enqueue_mask is not None:
            if len(enqueue_mask) != len(embeddings):
                raise ValueError(
                    f"enqueue_mask has {len(enqueue_mask)} entries for {len(embeddings)} embeddings"
                )
        elif len(embeddings) > self.memory_size:
            raise ValueError(
                f"a batch of {len(embeddings)} rows does not fit a memory of {self.memory_size}"
            )
        self.reset_stats()
        device = embeddings.device
        labels = c_f.to_device(labels, device=device)
        # PML moves and casts its buffers to the batch's device and dtype here.
        self._memory_like = (device, embeddings.dtype, labels.dtype)
        emb_np, lab_np = _emb(embeddings, "embeddings"), _lab(labels, "labels")
        if enqueue_mask is not None:
            mask = enqueue_mask.detach().cpu().numpy().astype(bool)
            done = self.bank.enqueue(emb_np, lab_np, mask=mask)
            keep = torch.from_numpy(~mask).to(device)
            embeddings, labels = embeddings[keep], labels[keep]
            do_remove_self_comparisons = False
        else:
            done = self.bank.enqueue(emb_np, lab_np)
            do_remove_self_comparisons = True
        if self.has_been_filled:
            self._unwritten = None
        self.curr_batch_idx = torch.from_numpy(done.slots.astype(np.int64)).to(device)
        exclusion = done.self_exclusion if do_remove_self_comparisons else "none"
        if indices_tuple is None and isinstance(self.loss, _LibraryLoss):
            rule = self.loss._rule_with(self.miner, with_refs=True)
            if rule is not False:
                # The loss against the memory in the library: no triplet or pair list.
                return self.loss._against_bank(embeddings, labels, self.bank, exclusion, rule)
        E_mem, L_mem = self._memory(device, embeddings.dtype, labels.dtype)
        indices_tuple = self._indices(
            embeddings, labels, E_mem, L_mem, indices_tuple, do_remove_self_comparisons, exclusion
        )
        return self.loss(embeddings, labels, indices_tuple, E_mem, L_mem)

    def _memory(self, device, dtype, label_dtype):
        """The filled rows and labels, as PML's ``E_mem`` and ``L_mem``."""
        emb, lab = self.bank.snapshot()
        return (
            torch.from_numpy(emb).to(device=device, dtype=dtype),
            torch.from_numpy(lab).to(device=device, dtype=label_dtype),
        )

    def create_indices_tuple(
        self,
        embeddings,
        labels,
        E_mem,
        L_mem,
        input_indices_tuple,
        do_remove_self_comparisons,
    ):
        """PML's method on the tensors given: the miner's tuple of ``embeddings`` against
        ``(E_mem, L_mem)`` (no miner: all pairs), without self comparisons when asked
        (``curr_batch_idx`` are the batch's slots), then ``input_indices_tuple`` (converted to
        the miner's kind) appended."""
        if self.miner:
            indices_tuple = self.miner(embeddings, labels, E_mem, L_mem)
        else:
            indices_tuple = lmu.get_all_pairs_indices(labels, L_mem)
        if do_remove_self_comparisons:
            indices_tuple = lmu.remove_self_comparisons(
                indices_tuple, self.curr_batch_idx, self.memory_size
            )
        return self._with_input(indices_tuple, input_indices_tuple, labels)

    def _indices(
        self, embeddings, labels, E_mem, L_mem, input_indices_tuple, do_remove, exclusion
    ):
        """:meth:`create_indices_tuple` for ``forward``, with the library's miners (and all
        pairs) run against the bank itself."""
        if _library_miner(self.miner) and self.miner._selects_per_anchor:
            indices_tuple = self.miner.mine_bank(embeddings, labels, self.bank, "none")
            if do_remove:
                indices_tuple = lmu.remove_self_comparisons(
                    indices_tuple, self.curr_batch_idx, self.memory_size
                )
        elif _library_miner(self.miner):
            indices_tuple = self.miner.mine_bank(embeddings, labels, self.bank, exclusion)
        elif self.miner:
            indices_tuple = self.miner(embeddings, labels, E_mem, L_mem)
            if do_remove:
                indices_tuple = lmu.remove_self_comparisons(
                    indices_tuple, self.curr_batch_idx, self.memory_size
                )
        else:
            pos, neg = _native.all_pairs(
                self.context, _lab(labels, "labels"), self.bank._inner, self_exclusion=exclusion
            )
            indices_tuple = _pair_tuple(pos, neg, embeddings.device)
        return self._with_input(indices_tuple, input_indices_tuple, labels)

    @staticmethod
    def _with_input(indices_tuple, input_indices_tuple, labels):
        if input_indices_tuple is None:
            return indices_tuple
        if len(input_indices_tuple) == 3 and len(indices_tuple) == 4:
            input_indices_tuple = lmu.convert_to_pairs(input_indices_tuple, labels)
        elif len(input_indices_tuple) == 4 and len(indices_tuple) == 3:
            input_indices_tuple = lmu.convert_to_triplets(input_indices_tuple, labels)
        return c_f.concatenate_indices_tuples(indices_tuple, input_indices_tuple)


def _library_miner(miner: Any) -> bool:
    """Whether ``miner`` is one of this module's and mines in the library as set."""
    return isinstance(miner, _LibraryMiner) and miner._library_runs()


def _loss_inputs(embeddings, labels, ref_emb, ref_labels):
    """A PML loss call's arrays: queries, labels, references (``None``: the queries) and the
    self-exclusion PML's identity rule gives (``ref_labels is labels``), and whether the
    references want their gradient."""
    # As PML's forward: the labels moved to the embeddings' device first (a no-op, keeping the
    # object, when they are there already), then compared by identity.
    labels = c_f.to_device(labels, embeddings)
    same = ref_labels is labels
    q, y = _emb(embeddings, "embeddings"), _lab(labels, "labels")
    if ref_emb is None:
        return q, y, None, None, False
    refs = (_emb(ref_emb, "ref_emb"), _lab(ref_labels, "ref_labels"))
    return q, y, refs, "same_index" if same else "none", ref_emb.requires_grad


class _LibraryLoss(_OnContext):
    """A PML loss computed by the library when it can be: no ``indices_tuple``, the default
    reducer, no regularizer, a distance the library computes. Anything else runs PML's own
    code (a distance without a kernel says so once, with a warning)."""

    _default_reducer: Any = None

    def _library_can(self) -> bool:
        if library_distance(self.distance) is None:
            _warn_fallback(self, self.distance)
            return False
        return self._default_reducers() and not self.all_regularization_loss_names()

    def _default_reducers(self) -> bool:
        """Whether the reducer is PML's default: the loss's own, or for a loss with several
        sub-losses (ContrastiveLoss, MarginLoss) PML's ``MultipleReducers`` of it."""
        def default(x: Any) -> bool:
            # The type and its thresholds (AvgNonZeroReducer is a ThresholdReducer(low=0)).
            fresh = self._default_reducer()
            return type(x) is type(fresh) and all(
                getattr(x, k, None) == getattr(fresh, k, None) for k in ("low", "high")
            )

        r = self.reducer
        if type(r) is pml_reducers.MultipleReducers:
            return set(r.reducers) == set(self.sub_loss_names()) and all(
                default(x) for x in r.reducers.values()
            )
        return default(r)

    def _rule_with(self, miner: Any, with_refs: bool = False):
        """The library's triplet rule with ``miner`` fused (``None``: all triplets), or
        ``False`` when the pair cannot be fused (``with_refs``: against references)."""
        raise NotImplementedError

    def _set_library_context(self, context, backend, budget) -> None:
        self._set_context(context, backend, budget)
        if library_distance(self.distance) is None:
            _warn_fallback(self, self.distance)


class TripletMarginLoss(_LibraryLoss, pml_losses.TripletMarginLoss):
    """PML's ``TripletMarginLoss(margin=0.05, swap=False, smooth_loss=False,
    triplets_per_anchor="all", distance=LpDistance())`` whose loss over every valid triplet
    (or those ``miner``, a :class:`TripletMarginMiner` of this module on the same distance,
    keeps) and its gradient come from the library: no triplet list, memory linear in the batch
    and the references. ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it
    requires grad). ``swap=True`` runs in the library without references; with ``ref_emb``
    (and in ``CrossBatchMemory``) PML reads ``d(p, n)`` from the embeddings-by-references
    matrix with reference indices as rows (its issue #748), so its own code runs there, as for
    the rest the library does not fuse: an ``indices_tuple``, ``triplets_per_anchor`` other
    than ``"all"``, another reducer, a regularizer, a distance without a kernel, another
    miner (which is then called first, as PML's users do).
    The library computes in float32 whatever the tensors' dtype (the loss and gradients are
    returned in it)."""

    _default_reducer = pml_reducers.AvgNonZeroReducer

    def __init__(
        self,
        margin: float = 0.05,
        swap: bool = False,
        smooth_loss: bool = False,
        triplets_per_anchor: Any = "all",
        miner: Any = None,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            margin=margin,
            swap=swap,
            smooth_loss=smooth_loss,
            triplets_per_anchor=triplets_per_anchor,
            **kwargs,
        )
        self.miner = miner
        if isinstance(miner, _LibraryMiner) and context is None:
            context = miner.context
        self._set_library_context(context, backend, budget)

    def _rule_with(self, miner: Any, with_refs: bool = False):
        swap_on_refs = self.swap and with_refs
        if swap_on_refs or self.triplets_per_anchor != "all" or not self._library_can():
            return False
        if miner is None:
            return None
        if (
            isinstance(miner, TripletMarginMiner)
            and miner._library_runs()
            and library_distance(miner.distance) == library_distance(self.distance)
        ):
            return (miner.type_of_triplets, float(miner.margin))
        return False

    def _call_args(self, rule) -> Dict[str, Any]:
        name, normalize = distance_args(self.distance)
        kind, miner_margin = rule if rule is not None else (None, 0.2)
        return dict(
            margin=float(self.margin),
            type_of_triplets=kind,
            miner_margin=miner_margin,
            distance=name,
            normalize=normalize,
            smooth_loss=bool(self.smooth_loss),
            swap=bool(self.swap),
        )

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        with_refs = ref_emb is not None
        rule = self._rule_with(self.miner, with_refs) if indices_tuple is None else False
        if rule is False or labels is None or (ref_emb is not None and ref_labels is None):
            if self.miner is not None and indices_tuple is None:
                indices_tuple = self.miner(embeddings, labels, ref_emb, ref_labels)
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.reset_stats()
        q, y, refs, exclusion, want_ref = _loss_inputs(embeddings, labels, ref_emb, ref_labels)
        out = _native.triplet_margin_loss(
            self.context, q, y, refs, self_exclusion=exclusion, ref_grad=want_ref,
            **self._call_args(rule),
        )
        if self.miner is not None:
            # What PML's BaseMiner records after mining: the fused miner's triplets.
            self.miner.num_triplets = int(out[2])
        return self._tensor(out, embeddings, ref_emb if want_ref else None)

    def _against_bank(self, embeddings, labels, bank: MemoryBank, exclusion, rule):
        """The loss of the batch against a bank's rows (detached), for CrossBatchMemory."""
        self.reset_stats()
        out = _native.triplet_margin_loss(
            self.context, _emb(embeddings, "embeddings"), _lab(labels, "labels"), bank._inner,
            self_exclusion=exclusion, **self._call_args(rule),
        )
        return self._tensor(out, embeddings, None)

    @staticmethod
    def _tensor(out, embeddings, ref_emb, extra=()):
        """The loss of a library result ``out`` (value first, the gradients fourth and fifth),
        its backward reaching ``embeddings``, ``ref_emb`` (when given) and the ``extra``
        ``(tensor, gradient)`` pairs."""
        value, grad, ref_grad = out[0], out[3], out[4]
        pairs = [(embeddings, grad)]
        if ref_emb is not None:
            pairs.append((ref_emb, ref_grad))
        pairs.extend(extra)
        return _loss_tensor(value, pairs)


class _WholeLoss(_LibraryLoss):
    """A PML loss the library computes over every pair of the batch (and the references)
    with no miner fused: ``_native_name`` is the library function, ``_library_args`` its
    loss parameters. PML's code runs instead with an ``indices_tuple``, another reducer, a
    regularizer or a distance the library does not compute."""

    _native_name = ""
    #: False where PML's loss refuses references: PML's code then runs for them.
    _takes_refs = True
    #: False where the drop-in CrossBatchMemory runs PML's code for the loss although it takes
    #: references (NCA: PML hands it the bank's pairs as weights).
    _in_bank = True

    def _library_args(self) -> Dict[str, Any]:
        raise NotImplementedError

    def _rule_with(self, miner: Any, with_refs: bool = False):
        if with_refs and not (self._takes_refs and self._in_bank):
            return False
        return None if miner is None and self._library_can() else False

    def _exclusion(self, embeddings, labels, ref_emb, ref_labels):
        """PML's self-exclusion for these arguments (its pair losses: the same labels
        object on both sides); ``None`` to keep :func:`_loss_inputs`' rule."""
        return None

    def _extra(self, out):
        """``(tensor, gradient)`` pairs beyond the embeddings' (a learnt parameter's)."""
        return ()

    def _call_args(self) -> Dict[str, Any]:
        name, normalize = distance_args(self.distance)
        return dict(distance=name, normalize=normalize, **self._library_args())

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        if (
            indices_tuple is not None
            or labels is None
            or not self._library_can()
            or (ref_emb is not None and (ref_labels is None or not self._takes_refs))
        ):
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.reset_stats()
        q, y, refs, exclusion, want_ref = _loss_inputs(embeddings, labels, ref_emb, ref_labels)
        own = self._exclusion(embeddings, labels, ref_emb, ref_labels)
        out = getattr(_native, self._native_name)(
            self.context, q, y, refs, self_exclusion=own or exclusion, ref_grad=want_ref,
            **self._call_args(),
        )
        ref = ref_emb if want_ref else None
        return TripletMarginLoss._tensor(out, embeddings, ref, self._extra(out))

    def _against_bank(self, embeddings, labels, bank: MemoryBank, exclusion, rule):
        """The loss of the batch against a bank's rows (detached), for CrossBatchMemory."""
        self.reset_stats()
        out = getattr(_native, self._native_name)(
            self.context, _emb(embeddings, "embeddings"), _lab(labels, "labels"), bank._inner,
            self_exclusion=exclusion, **self._call_args(),
        )
        return TripletMarginLoss._tensor(out, embeddings, None, self._extra(out))


class NTXentLoss(_WholeLoss, pml_losses.NTXentLoss):
    """PML's ``NTXentLoss(temperature=0.07, distance=CosineSimilarity())`` whose value and
    gradient come from the library, in row blocks: the ``(b, m)`` similarity matrix and PML's
    ``(positive pairs × negative pairs)`` mask never exist. ``loss.backward()`` reaches
    ``embeddings`` (and ``ref_emb`` when it requires grad). PML's code runs instead with an
    ``indices_tuple``, another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "ntxent_loss"

    def __init__(
        self,
        temperature: float = 0.07,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(temperature=temperature, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(temperature=float(self.temperature))


class ContrastiveLoss(_WholeLoss, pml_losses.ContrastiveLoss):
    """PML's ``ContrastiveLoss(pos_margin=0, neg_margin=1, distance=LpDistance())`` whose
    value and gradient come from the library over every positive and negative pair, in row
    blocks (a first pass counts each group's nonzero pairs, as its ``AvgNonZeroReducer``
    divides by them). ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it
    requires grad). PML's code runs instead with an ``indices_tuple``, another reducer or a
    regularizer."""

    _default_reducer = pml_reducers.AvgNonZeroReducer
    _native_name = "contrastive_loss"

    def __init__(
        self,
        pos_margin: float = 0,
        neg_margin: float = 1,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(pos_margin=pos_margin, neg_margin=neg_margin, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(pos_margin=float(self.pos_margin), neg_margin=float(self.neg_margin))


class MultiSimilarityLoss(_WholeLoss, pml_losses.MultiSimilarityLoss):
    """PML's ``MultiSimilarityLoss(alpha=2, beta=50, base=0.5, distance=CosineSimilarity())``
    whose value and gradient come from the library over every pair, in row blocks.
    ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it requires grad). PML's
    code runs instead with an ``indices_tuple`` (a ``MultiSimilarityMiner``'s pairs), another
    reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "multi_similarity_loss"

    def __init__(
        self,
        alpha: float = 2,
        beta: float = 50,
        base: float = 0.5,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(alpha=alpha, beta=beta, base=base, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(alpha=float(self.alpha), beta=float(self.beta), base=float(self.base))


class SupConLoss(_WholeLoss, pml_losses.SupConLoss):
    """PML's ``SupConLoss(temperature=0.1, distance=CosineSimilarity())`` whose value and
    gradient come from the library over every pair, in row blocks. ``loss.backward()``
    reaches ``embeddings`` (and ``ref_emb`` when it requires grad). PML's code runs instead
    with an ``indices_tuple``, another reducer or a regularizer."""

    _default_reducer = pml_reducers.AvgNonZeroReducer
    _native_name = "supcon_loss"

    def __init__(
        self,
        temperature: float = 0.1,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(temperature=temperature, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(temperature=float(self.temperature))


class CircleLoss(_WholeLoss, pml_losses.CircleLoss):
    """PML's ``CircleLoss(m=0.4, gamma=80)`` (cosine similarity only, as PML asserts) whose
    value and gradient come from the library over every pair, in row blocks.
    ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it requires grad). PML's
    code runs instead with an ``indices_tuple``, another reducer or a regularizer."""

    _default_reducer = pml_reducers.AvgNonZeroReducer
    _native_name = "circle_loss"

    def __init__(
        self,
        m: float = 0.4,
        gamma: float = 80,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(m=m, gamma=gamma, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(m=float(self.m), gamma=float(self.gamma))


class NCALoss(_WholeLoss, pml_losses.NCALoss):
    """PML's ``NCALoss(softmax_scale=1, distance=LpDistance(power=2))`` whose value and
    gradient come from the library, in row blocks. ``loss.backward()`` reaches ``embeddings``
    (and ``ref_emb`` when it requires grad). As PML, an anchor's own row is left out only
    when ``ref_emb`` is ``embeddings`` itself. Where no anchor has a positive, PML returns NaN
    (a mean over nothing) and the library 0. PML's code runs instead with an
    ``indices_tuple`` (PML's weights from it), another reducer, a regularizer, and inside
    ``CrossBatchMemory``, which hands NCA its pairs as weights."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "nca_loss"
    _in_bank = False

    def __init__(
        self,
        softmax_scale: float = 1,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(softmax_scale=softmax_scale, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(softmax_scale=float(self.softmax_scale))

    def _exclusion(self, embeddings, labels, ref_emb, ref_labels):
        if ref_emb is None or ref_emb is embeddings:
            return "same_index" if ref_emb is not None else None
        return "none"


class GeneralizedLiftedStructureLoss(_WholeLoss, pml_losses.GeneralizedLiftedStructureLoss):
    """PML's ``GeneralizedLiftedStructureLoss(neg_margin=1, pos_margin=0,
    distance=LpDistance())`` whose value and gradient come from the library over every pair,
    in row blocks. ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it
    requires grad). PML's code runs instead with an ``indices_tuple``, another reducer or a
    regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "generalized_lifted_structure_loss"

    def __init__(
        self,
        neg_margin: float = 1,
        pos_margin: float = 0,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(neg_margin=neg_margin, pos_margin=pos_margin, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(pos_margin=float(self.pos_margin), neg_margin=float(self.neg_margin))


class MarginLoss(_WholeLoss, pml_losses.MarginLoss):
    """PML's ``MarginLoss(margin=0.2, nu=0, beta=1.2, triplets_per_anchor="all",
    learn_beta=False, num_classes=None, distance=LpDistance())`` whose value and gradient
    (for ``beta`` too, when it is learnt) come from the library over every triplet without
    listing them: memory linear in the batch and the references, where PML builds
    ``B·M·M`` triplets. ``loss.backward()`` reaches ``embeddings``, ``ref_emb`` when it
    requires grad, and ``beta``. PML's code runs instead with one β per class
    (``num_classes``), ``triplets_per_anchor`` other than ``"all"``, an ``indices_tuple``,
    another reducer or a regularizer."""

    _default_reducer = pml_reducers.DivisorReducer
    _native_name = "margin_loss"

    def __init__(
        self,
        margin: float = 0.2,
        nu: float = 0,
        beta: float = 1.2,
        triplets_per_anchor: Any = "all",
        learn_beta: bool = False,
        num_classes: Optional[int] = None,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            margin=margin, nu=nu, beta=beta, triplets_per_anchor=triplets_per_anchor,
            learn_beta=learn_beta, num_classes=num_classes, **kwargs,
        )
        self._set_library_context(context, backend, budget)

    def _library_can(self) -> bool:
        return (
            len(self.beta) == 1 and self.triplets_per_anchor == "all" and super()._library_can()
        )

    def _library_args(self) -> Dict[str, Any]:
        return dict(
            margin=float(self.margin), nu=float(self.nu), beta=float(self.beta.detach()[0]),
            learn_beta=bool(self.learn_beta),
        )

    def _extra(self, out):
        if not self.learn_beta or len(out) < 6:
            return ()
        return ((self.beta, np.array([out[5]], dtype=np.float32)),)


class FastAPLoss(_WholeLoss, pml_losses.FastAPLoss):
    """PML's ``FastAPLoss(num_bins=10, distance=LpDistance(power=2))`` whose value and
    gradient come from the library, one anchor's soft histograms at a time (PML builds a
    ``(bins, B, B)`` tensor). ``loss.backward()`` reaches ``embeddings``. As PML, it refuses
    references (``ref_emb``, and so ``CrossBatchMemory``): PML's code runs for them and
    raises its error. PML's code also runs with an ``indices_tuple``, another reducer or a
    regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "fast_ap_loss"
    _takes_refs = False

    def __init__(
        self,
        num_bins: int = 10,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_bins=num_bins, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(num_bins=int(self.num_bins))



class MultipleNegativesRankingLoss(_OnContext, torch.nn.Module):
    """sentence-transformers' ``MultipleNegativesRankingLoss(scale=20.0)`` (cosine
    similarity) on embeddings: ``loss(anchors, candidates)`` with ``candidates[i]`` anchor
    ``i``'s positive and every other row (the other positives, hard negatives, a memory's
    rows) a negative. Value and gradients come from the library in row blocks (the ``(b, c)``
    matrix never exists whole); ``backward()`` reaches both inputs. For a GradCache step,
    call it on detached embeddings that require grad, then push their ``.grad`` through the
    model mini-batch by mini-batch (see ``python/examples/gradcache.py``)."""

    def __init__(
        self,
        scale: float = 20.0,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
    ) -> None:
        super().__init__()
        self.scale = scale
        self._set_context(context, backend, budget)

    def forward(self, anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        value, _, _, grad, cand_grad = _native.multiple_negatives_ranking_loss(
            self.context, _emb(anchors, "anchors"), _emb(candidates, "candidates"),
            scale=float(self.scale),
        )
        return _loss_tensor(value, [(anchors, grad), (candidates, cand_grad)])


class LiftedStructureLoss(_WholeLoss, pml_losses.LiftedStructureLoss):
    """PML's ``LiftedStructureLoss(neg_margin=1, pos_margin=0, distance=LpDistance())`` whose
    value and gradient come from the library in three passes over row blocks: PML's
    ``(positive pairs × negative pairs)`` mask never exists. As PML, a positive pair's
    second row is the query of the positive's index, also against references.
    ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it requires grad). PML's
    code runs instead with an ``indices_tuple``, another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "lifted_structure_loss"

    def __init__(
        self,
        neg_margin: float = 1,
        pos_margin: float = 0,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(neg_margin=neg_margin, pos_margin=pos_margin, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(pos_margin=float(self.pos_margin), neg_margin=float(self.neg_margin))


class _OnlyCosine:
    """A loss the library computes on cosine similarity only, PML's code running for the
    others (PML does not assert the distance for it)."""

    def _library_can(self) -> bool:
        cosine = type(self.distance) is pml_distances.CosineSimilarity
        return cosine and super()._library_can()  # type: ignore[misc]


class HistogramLoss(_OnlyCosine, _WholeLoss, pml_losses.HistogramLoss):
    """PML's ``HistogramLoss(n_bins=100, delta=None, distance=CosineSimilarity())`` whose
    value and gradient come from the library: two passes over row blocks fill and then
    differentiate the two histograms (PML lists every triplet). ``loss.backward()`` reaches
    ``embeddings``. As PML, it refuses references (``ref_emb``, ``CrossBatchMemory``): PML's
    code runs for them and raises its error. PML's code also runs with an
    ``indices_tuple``, another distance, reducer or a regularizer. A similarity of exactly 1,
    where PML's ``scatter_add`` fails, falls in the top bin."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "histogram_loss"
    _takes_refs = False

    def __init__(
        self,
        n_bins: Optional[int] = None,
        delta: Optional[float] = None,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(n_bins=n_bins, delta=delta, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_can(self) -> bool:
        # The library's bins split [-1, 1] evenly: a delta that does not, PML's code runs.
        bins = 2 / self.delta
        return abs(bins - round(bins)) <= 1e-9 * bins and super()._library_can()

    def _library_args(self) -> Dict[str, Any]:
        return dict(n_bins=int(round(2 / self.delta)))


class TupletMarginLoss(_WholeLoss, pml_losses.TupletMarginLoss):
    """PML's ``TupletMarginLoss(margin=5.73, scale=64)`` (cosine similarity, as PML asserts)
    whose value and gradient come from the library over every positive pair, in row blocks
    (PML repeats the negative pairs once per positive pair). ``loss.backward()`` reaches
    ``embeddings`` (and ``ref_emb`` when it requires grad). The angle statistics are not
    recorded. PML's code runs instead with an ``indices_tuple``, another reducer or a
    regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "tuplet_margin_loss"

    def __init__(
        self,
        margin: float = 5.73,
        scale: float = 64,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(margin=margin, scale=scale, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_can(self) -> bool:
        # The library refuses a scale that is not positive: PML's code computes it.
        return self.scale > 0 and super()._library_can()

    def _library_args(self) -> Dict[str, Any]:
        return dict(margin=float(np.degrees(self.margin)), scale=float(self.scale))


class IntraPairVarianceLoss(_WholeLoss, pml_losses.IntraPairVarianceLoss):
    """PML's ``IntraPairVarianceLoss(pos_eps=0.01, neg_eps=0.01, distance=CosineSimilarity())``
    whose value and gradient come from the library in three passes over row blocks (the
    means, the hinges' sums, the gradient). ``loss.backward()`` reaches ``embeddings`` (and
    ``ref_emb`` when it requires grad). PML's code runs instead with an ``indices_tuple``,
    another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "intra_pair_variance_loss"

    def __init__(
        self,
        pos_eps: float = 0.01,
        neg_eps: float = 0.01,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(pos_eps=pos_eps, neg_eps=neg_eps, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(pos_eps=float(self.pos_eps), neg_eps=float(self.neg_eps))


class RankedListLoss(_WholeLoss, pml_losses.RankedListLoss):
    """PML's ``RankedListLoss(margin, Tn, imbalance=0.5, alpha=None, Tp=0,
    distance=LpDistance())`` whose value and gradient come from the library, one anchor's
    row at a time (PML builds five ``(b, b)`` matrices). ``loss.backward()`` reaches
    ``embeddings``. As PML, it refuses references and an ``indices_tuple``: PML's code runs
    for them and raises its error. PML's code also runs with another reducer or a
    regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "ranked_list_loss"
    _takes_refs = False

    def __init__(
        self,
        margin: float,
        Tn: float,
        imbalance: float = 0.5,
        alpha: Optional[float] = None,
        Tp: float = 0,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(margin=margin, Tn=Tn, imbalance=imbalance, alpha=alpha, Tp=Tp, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(
            margin=float(self.margin), tn=float(self.Tn), imbalance=float(self.imbalance),
            alpha=float(self.alpha), tp=float(self.Tp),
        )


class ThresholdConsistentMarginLoss(_WholeLoss, pml_losses.ThresholdConsistentMarginLoss):
    """PML's ``ThresholdConsistentMarginLoss(lambda_plus=1, lambda_minus=1, margin_plus=0.9,
    margin_minus=0.5)`` (cosine similarity, as PML asserts) whose value and gradient come from
    the library in two passes over row blocks (the pairs past each margin counted, then the
    gradient). ``loss.backward()`` reaches ``embeddings``. PML's code runs instead with
    references (it indexes ``embeddings`` with the references' pairs), an ``indices_tuple``,
    another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "threshold_consistent_margin_loss"
    _takes_refs = False

    def __init__(
        self,
        lambda_plus: float = 1.0,
        lambda_minus: float = 1.0,
        margin_plus: float = 0.9,
        margin_minus: float = 0.5,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            lambda_plus=lambda_plus, lambda_minus=lambda_minus, margin_plus=margin_plus,
            margin_minus=margin_minus, **kwargs,
        )
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return dict(
            lambda_plus=float(self.lambda_plus), lambda_minus=float(self.lambda_minus),
            margin_plus=float(self.margin_plus), margin_minus=float(self.margin_minus),
        )


class PNPLoss(_WholeLoss, pml_losses.PNPLoss):
    """PML's ``PNPLoss(b=2, alpha=1, anneal=0.01, variant="O")`` (cosine similarity, as PML
    asserts) whose value and gradient come from the library one anchor's row at a time
    (PML builds ``(b, b, b)`` tensors). ``loss.backward()`` reaches ``embeddings``. As PML,
    it refuses references and an ``indices_tuple``: PML's code runs for them and raises its
    error. PML's code also runs with another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "pnp_loss"
    _takes_refs = False

    def __init__(
        self,
        b: float = 2,
        alpha: float = 1,
        anneal: float = 0.01,
        variant: str = "O",
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(b=b, alpha=alpha, anneal=anneal, variant=variant, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_can(self) -> bool:
        # The library refuses anneal <= 0 (and b <= 0 for Ib): PML's code computes them.
        positive = self.anneal > 0 and (self.variant != "Ib" or self.b > 0)
        return positive and super()._library_can()

    def _library_args(self) -> Dict[str, Any]:
        return dict(
            b=float(self.b), alpha=float(self.alpha), anneal=float(self.anneal),
            variant=str(self.variant),
        )


class NPairsLoss(_WholeLoss, pml_losses.NPairsLoss):
    """PML's ``NPairsLoss(distance=DotProductSimilarity())`` whose value and gradient come
    from the library in row blocks: each label's first row with its second, as PML picks
    them, the cross entropy of every first row over all the second rows. ``loss.backward()``
    reaches ``embeddings``. ``num_pairs`` is recorded. As PML, it refuses references: PML's
    code runs for them and raises its error. PML's code also runs with an
    ``indices_tuple``, another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "n_pairs_loss"
    _takes_refs = False

    def __init__(
        self,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return {}

    def _extra(self, out):
        self.num_pairs = int(out[1])
        return ()


class InstanceLoss(_WholeLoss, pml_losses.InstanceLoss):
    """PML's ``InstanceLoss(gamma=64, distance=CosineSimilarity())`` whose value and gradient
    come from the library in row blocks: each row's cross entropy over its ``gamma``-scaled
    similarities to the batch (its own included), the target column its label's rank among
    the sorted distinct labels, as PML's ``torch.unique(return_inverse=True)`` gives it; the
    ``(b, b)`` matrix never exists. ``loss.backward()`` reaches ``embeddings``. As PML, it
    refuses references and an ``indices_tuple``: PML's code runs for them and raises its
    error. PML's code also runs without labels, with another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "instance_loss"
    _takes_refs = False

    def __init__(
        self,
        gamma: float = 64,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gamma=gamma, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_can(self) -> bool:
        # The library refuses a gamma that is not positive: PML's code computes it.
        return 0 < self.gamma < float("inf") and super()._library_can()

    def _library_args(self) -> Dict[str, Any]:
        return {"gamma": float(self.gamma)}


class AngularLoss(_WholeLoss, pml_losses.AngularLoss):
    """PML's ``AngularLoss(alpha=40)`` (its ``LpDistance()`` only) whose value and gradient come
    from the library: each class's anchors and positives are multiplied by the references
    once, not every positive pair (PML's ``(pairs, m, d)`` product and ``(pairs, m)`` matrix
    never exist). ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it requires
    grad). As in PML, the negatives are not normalised. PML's code runs instead with an
    ``indices_tuple``, another reducer or a regularizer. ``average_angle`` is not recorded."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "angular_loss"

    def __init__(
        self,
        alpha: float = 40,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(alpha=alpha, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_args(self) -> Dict[str, Any]:
        return {"alpha": float(np.degrees(float(self.alpha)))}


class VICRegLoss(_LibraryLoss, pml_losses.VICRegLoss):
    """PML's ``VICRegLoss(invariance_lambda=25, variance_mu=25, covariance_v=1, eps=1e-4)``
    whose value and gradients come from the library: the covariance term from the smaller of
    the ``(n, n)`` and ``(d, d)`` Gram matrices (PML always forms ``(d, d)``).
    ``loss.backward()`` reaches ``embeddings`` and ``ref_emb``. PML's code runs instead (and
    raises where PML raises) with labels or an ``indices_tuple``, another reducer, fewer than
    two rows, views of different shapes, or an ``eps`` that is not positive."""

    _default_reducer = pml_reducers.MeanReducer

    def __init__(
        self,
        invariance_lambda: float = 25,
        variance_mu: float = 25,
        covariance_v: float = 1,
        eps: float = 1e-4,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            invariance_lambda=invariance_lambda, variance_mu=variance_mu,
            covariance_v=covariance_v, eps=eps, **kwargs,
        )
        self._set_context(context, backend, budget)

    def _library_can(self) -> bool:
        weights = (self.invariance_lambda, self.variance_mu, self.covariance_v)
        return (
            all(np.isfinite(float(w)) for w in weights)
            and 0 < float(self.eps) < float("inf")
            and self._default_reducers()
        )

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        if (
            labels is not None
            or indices_tuple is not None
            or ref_labels is not None
            or embeddings.dim() != 2
            or embeddings.shape[0] < 2
            or (ref_emb is not None and ref_emb.shape != embeddings.shape)
            or not self._library_can()
        ):
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.reset_stats()
        second = None if ref_emb is None else _emb(ref_emb, "ref_emb")
        out = _native.vicreg_loss(
            self.context, _emb(embeddings, "embeddings"), second,
            invariance_lambda=float(self.invariance_lambda), variance_mu=float(self.variance_mu),
            covariance_v=float(self.covariance_v), eps=float(self.eps),
        )
        pairs = [(embeddings, out[4])]
        if ref_emb is not None:
            pairs.append((ref_emb, out[5]))
        return _loss_tensor(out[0], pairs)


class SignalToNoiseRatioContrastiveLoss(_WholeLoss, pml_losses.SignalToNoiseRatioContrastiveLoss):
    """PML's ``SignalToNoiseRatioContrastiveLoss(pos_margin=0, neg_margin=1,
    distance=SNRDistance())`` whose value and gradient come from the library, as
    :class:`ContrastiveLoss`'s do: the SNR distance ``var(q - r) / var(q)`` is the squared
    distance of the centred rows over the query's squared norm, in row blocks.
    ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it requires grad). PML's
    code runs instead with an ``indices_tuple``, another reducer, a regularizer or another
    distance (``SNRDistance(p=…)`` normalising by another norm than L2 included)."""

    _default_reducer = pml_reducers.AvgNonZeroReducer
    _native_name = "snr_contrastive_loss"

    def __init__(
        self,
        pos_margin: float = 0,
        neg_margin: float = 1,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(pos_margin=pos_margin, neg_margin=neg_margin, **kwargs)
        self._set_context(context, backend, budget)

    def _library_can(self) -> bool:
        d = self.distance
        # PML normalises with the distance's p: the library's normalisation is L2.
        snr = type(d) is pml_distances.SNRDistance and d.power == 1
        snr = snr and (d.p == 2 or not d.normalize_embeddings)
        return snr and self._default_reducers() and not self.all_regularization_loss_names()

    def _call_args(self) -> Dict[str, Any]:
        return dict(
            distance="squared_euclidean", normalize=bool(self.distance.normalize_embeddings),
            pos_margin=float(self.pos_margin), neg_margin=float(self.neg_margin),
        )


class DynamicSoftMarginLoss(_WholeLoss, pml_losses.DynamicSoftMarginLoss):
    """PML's ``DynamicSoftMarginLoss(min_val=-2, num_bins=10, momentum=0.01,
    distance=LpDistance())`` whose value, gradient and histogram (``hist_``, carried from call
    to call) come from the library, over every triplet without listing one (PML lists
    ``B·P·N``). ``loss.backward()`` reaches ``embeddings`` (and ``ref_emb`` when it requires
    grad), through the CDF and this batch's part of the histogram as PML's autograd goes; the
    previous histogram is a constant, where PML's second ``backward()`` raises (its ``hist_``
    keeps the last step's graph). A triplet outside the histogram raises ``ValueError`` (PML:
    an index error). PML's code runs instead without labels, with an ``indices_tuple``,
    another reducer or a regularizer."""

    _default_reducer = pml_reducers.MeanReducer
    _native_name = "dynamic_soft_margin_loss"

    def __init__(
        self,
        min_val: float = -2.0,
        num_bins: int = 10,
        momentum: float = 0.01,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(min_val=min_val, num_bins=num_bins, momentum=momentum, **kwargs)
        self._set_library_context(context, backend, budget)

    def _library_can(self) -> bool:
        return (
            self.min_val != 0 and 2 <= self.num_bins <= 65536 and super()._library_can()
        )

    def _library_args(self) -> Dict[str, Any]:
        hist = self.hist_.detach().cpu().double().numpy()
        return dict(
            min_val=float(self.min_val), num_bins=int(self.num_bins),
            momentum=float(self.momentum), histogram=[float(v) for v in hist],
        )

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        # PML keeps hist_ on the embeddings' device, in their dtype.
        self._like = (embeddings.device, embeddings.dtype)
        return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)

    def _against_bank(self, embeddings, labels, bank, exclusion, rule):
        self._like = (embeddings.device, embeddings.dtype)
        return super()._against_bank(embeddings, labels, bank, exclusion, rule)

    def _extra(self, out):
        # The histogram after the call, where and as PML leaves it.
        device, dtype = self._like
        self.hist_ = torch.tensor(out[5], dtype=dtype, device=device)
        return ()


class _ClassifierLoss(_LibraryLoss):
    """A PML loss with class weights (``W``, ``fc`` or ``proxies``) whose value and gradients
    (for the embeddings and the weights) come from the library, tiled over the classes: no
    ``(batch, classes)`` logit matrix. The weights stay PML's parameter, in PML's layout, so
    ``SGD(loss_func.parameters())`` keeps working. PML's code runs instead without labels,
    with an ``indices_tuple`` (miner weights), ``ref_emb``, another reducer, distance or dtype
    (float16), a regularizer, or an empty batch.

    ``sample_rate`` (PartialFC's, insightface's ``sample_rate``; default 1, every class): the
    softmax runs over the classes with a row in the batch and each other class with this
    probability, drawn from ``seed`` plus the number of calls so far (a new draw each step,
    the same on every rank) and the class's index only, so a sharded run equals one process.
    The weights' gradient is 0 on the classes left out. Not for ProxyAnchorLoss, and only on
    the library's path (what PML's code would run instead raises). The count of calls is not
    in the ``state_dict`` (which stays PML's): after a resume, give ``seed`` anew.

    ``distributed="replicated"`` broadcasts rank 0's weights at the first call; with
    ``check_every=k`` every ``k``-th call also compares a checksum of every rank's weights and
    raises on every rank when they differ (every rank calls the loss at every step, so they
    count calls alike). A ``distributed="sharded"`` loss refuses to be wrapped in
    ``DistributedDataParallel`` (which would broadcast rank 0's classes over every rank's and
    average the gradients of different classes): at the wrap when the loss itself is wrapped,
    at its first call through a wrapped model's ``forward`` when it is inside one, unless its
    weights are in DDP's parameters to ignore. A loss inside a wrapped model but called
    outside the wrapper's ``forward`` is not seen."""

    _default_reducer = pml_reducers.MeanReducer
    _kind = ""
    _weights = "W"
    _distance: Any = pml_distances.CosineSimilarity
    _power = 1

    def __init__(
        self,
        *args: Any,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
        distributed: Optional[str] = None,
        process_group: Any = None,
        sample_rate: float = 1.0,
        seed: int = 0,
        check_every: int = 0,
        **kwargs: Any,
    ) -> None:
        if distributed not in (None, "replicated", "sharded"):
            raise ValueError(
                f"distributed must be None, 'replicated' or 'sharded', got {distributed!r}"
            )
        # The library takes it in float32: what rounds to 0, or to 1 from below, is refused.
        rate32 = float(np.float32(sample_rate))
        if not (0.0 < rate32 <= 1.0 and (rate32 < 1.0) == (float(sample_rate) < 1.0)):
            raise ValueError(
                f"sample_rate must be in (0, 1] in float32 (1 only as 1), got {sample_rate!r}"
            )
        if float(sample_rate) < 1.0 and self._kind == "proxy_anchor":
            raise ValueError(
                "sample_rate is PartialFC's sampling for the softmax losses: ProxyAnchorLoss's "
                "terms are per class, over every class"
            )
        if not 0 <= int(seed) < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed!r}")
        if int(check_every) < 0 or (check_every and distributed != "replicated"):
            raise ValueError(
                "check_every compares replicated weights: a count of calls >= 0, with "
                f"distributed='replicated' (got {check_every!r} with {distributed!r})"
            )
        super().__init__(*args, **kwargs)
        self._set_context(context, backend, budget)
        # Over torch.distributed (wgpu_metric_learning.distributed): every rank calls the
        # loss at once. Not the default: a loss called on some ranks only would wait forever.
        self.distributed = distributed
        self.process_group = process_group
        self._broadcast = False
        self.sample_rate = float(sample_rate)
        self.seed = int(seed)
        self.check_every = int(check_every)
        self._calls = 0

    def _options(self) -> Dict[str, Any]:
        raise NotImplementedError

    def _sampling(self) -> Dict[str, Any]:
        """This call's sampling options (a new seed every call), counting the call."""
        calls, self._calls = self._calls, self._calls + 1
        if self.sample_rate >= 1.0:
            return {}
        return dict(sample_rate=self.sample_rate, seed=(self.seed + calls) % 2**64)

    # DistributedDataParallel reads this attribute of the module it wraps (a list of the
    # names it leaves alone): a sharded loss refuses a wrap that would take its shard.
    @property
    def _ddp_params_and_buffers_to_ignore(self) -> List[str]:
        ignored = list(self.__dict__.get("_wml_ddp_ignored", ()))
        if getattr(self, "distributed", None) == "sharded" and self._weights not in ignored:
            raise RuntimeError(self._ddp_refusal(self._weights))
        return ignored

    @_ddp_params_and_buffers_to_ignore.setter
    def _ddp_params_and_buffers_to_ignore(self, names: Any) -> None:
        self.__dict__["_wml_ddp_ignored"] = list(names)

    def _ddp_refusal(self, name: str) -> str:
        return (
            f"{type(self).__name__}(distributed='sharded') holds this rank's classes in "
            f"{name!r}: DistributedDataParallel would broadcast rank 0's classes over every "
            "rank's and average the gradients of different classes. Keep the loss out of DDP "
            "(the library already moves what crosses the ranks), or list its weights in DDP's "
            "parameters to ignore (DistributedDataParallel."
            "_set_params_and_buffers_to_ignore_for_model) before wrapping."
        )

    def _refuse_enclosing_ddp(self, weights: torch.Tensor) -> None:
        """Raises when a DistributedDataParallel up the call stack synchronises ``weights``
        (the loss inside a wrapped model: DDP reads only the outer module's ignore list)."""
        ddp = torch.nn.parallel.DistributedDataParallel
        forward = ddp.forward.__code__
        frame = sys._getframe(1)
        while frame is not None:
            # Only DDP's own forward's locals are read (reading every frame's copies them).
            owner = frame.f_locals.get("self") if frame.f_code is forward else None
            if isinstance(owner, ddp):
                ignored = getattr(owner, "parameters_to_ignore", set())
                for name, p in owner.module.named_parameters():
                    if p is weights and name not in ignored:
                        raise RuntimeError(
                            self._ddp_refusal(name) + " Its wrap has already copied rank 0's "
                            "shard over this rank's: reload the weights."
                        )
            frame = frame.f_back

    def _distributed_forward(self, embeddings, labels, weights):
        from . import distributed as _dist

        if self.distributed == "sharded":
            self._refuse_enclosing_ddp(weights)
        if self.distributed == "replicated" and not self._broadcast:
            # The same W on every rank from the start: rank 0's.
            src = torch.distributed.get_global_rank(self.process_group, 0) if self.process_group else 0
            torch.distributed.broadcast(weights.data, src=src, group=self.process_group)
            self._broadcast = True
        elif self.check_every and self._calls % self.check_every == 0:
            _dist.check_replicas(weights, self.process_group)
        options = dict(self._options(), **self._sampling())
        out = _dist.sharded_call(
            self.context, _emb(embeddings, "embeddings"), _lab(labels, "labels"),
            _emb(weights, self._weights), self._kind, self.distributed,
            int(options.get("centres", 1)), self._weights == "proxies", self.process_group,
            **options,
        )
        return _loss_tensor(out[0], [(embeddings, out[2]), (weights, out[3])])

    def _library_can(self) -> bool:
        d = self.distance
        distance = (
            type(d) is self._distance and d.power == self._power and d.p == 2
            and bool(d.normalize_embeddings)
        )
        return distance and self._default_reducers() and not self.all_regularization_loss_names()

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        if (
            labels is None
            or indices_tuple is not None
            or ref_emb is not None
            or ref_labels is not None
            or embeddings.dim() != 2
            # Distributed, a rank's batch may be empty: the others' rows are the loss's.
            or (embeddings.shape[0] == 0 and self.distributed is None)
            or embeddings.dtype not in (torch.float32, torch.float64)
            or not self._library_can()
        ):
            if self.sample_rate < 1.0:
                raise ValueError(
                    "sample_rate runs only on the library's path: labels, no indices_tuple or "
                    "ref_emb, 2-d float32/float64 embeddings, the default reducer and distance, "
                    "no regularizer"
                )
            if self.distributed is not None:
                # PML's code would give each rank its own W gradient: the very fault.
                raise ValueError(
                    f"distributed={self.distributed!r} runs only on the library's path: labels, "
                    "no indices_tuple or ref_emb, 2-d float32/float64 embeddings with rows, the "
                    "default reducer and distance, no regularizer"
                )
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        self.reset_stats()
        # As PML's compute_loss: the weights follow the embeddings' dtype and device.
        self.cast_types(embeddings.dtype, embeddings.device)
        weights = getattr(self, self._weights)
        if self.distributed is not None:
            return self._distributed_forward(embeddings, labels, weights)
        out = _native.classifier_loss(
            self.context, _emb(embeddings, "embeddings"), _lab(labels, "labels"),
            _emb(weights, self._weights), self._kind, **self._options(), **self._sampling(),
        )
        return _loss_tensor(out[0], [(embeddings, out[2]), (weights, out[3])])


class ArcFaceLoss(_ClassifierLoss, pml_losses.ArcFaceLoss):
    """PML's ``ArcFaceLoss(num_classes, embedding_size, margin=28.6, scale=64)`` (``W``
    ``(embedding_size, num_classes)``), computed as :class:`_ClassifierLoss` says. The
    target's gradient goes through ``acos`` as PML's autograd does; at a cosine of exactly
    ±1, where PML's is infinite, it is held at its value for the f32 cosine next to 1.
    ``margin_grad="straight_through"`` gives insightface's instead."""

    _kind = "arcface"

    def __init__(self, *args: Any, margin_grad: str = "pml", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.margin_grad = margin_grad

    def _options(self) -> Dict[str, Any]:
        return dict(
            margin=float(np.degrees(self.margin)), scale=float(self.scale),
            margin_grad=self.margin_grad,
        )


class SubCenterArcFaceLoss(ArcFaceLoss, pml_losses.SubCenterArcFaceLoss):
    """PML's ``SubCenterArcFaceLoss(num_classes=, embedding_size=, margin=28.6, scale=64,
    sub_centers=3)``: class ``j``'s centres are ``W``'s columns ``j·k … j·k + k − 1`` and its
    cosine their best (the gradient to the first best, as torch's ``max``)."""

    _kind = "sub_center_arcface"

    def _options(self) -> Dict[str, Any]:
        return dict(super()._options(), centres=int(self.sub_centers))


class CosFaceLoss(_ClassifierLoss, pml_losses.CosFaceLoss):
    """PML's ``CosFaceLoss(num_classes, embedding_size, margin=0.35, scale=64)``."""

    _kind = "cosface"

    def _options(self) -> Dict[str, Any]:
        return dict(margin=float(self.margin), scale=float(self.scale))


class LargeMarginSoftmaxLoss(_ClassifierLoss, pml_losses.LargeMarginSoftmaxLoss):
    """PML's ``LargeMarginSoftmaxLoss(num_classes, embedding_size, margin=4, scale=1)``:
    ``cos(mθ)`` on the target, logits times ``‖x‖ ‖w‖`` (their gradients included). PML's
    code runs for a margin below 1."""

    _kind = "large_margin_softmax"

    def _library_can(self) -> bool:
        return int(self.margin) >= 1 and super()._library_can()

    def _options(self) -> Dict[str, Any]:
        return dict(margin=float(int(self.margin)), scale=float(self.scale))


class SphereFaceLoss(LargeMarginSoftmaxLoss, pml_losses.SphereFaceLoss):
    """PML's ``SphereFaceLoss(num_classes, embedding_size, margin=4, scale=1)``: as
    :class:`LargeMarginSoftmaxLoss`, logits times ``‖x‖`` only."""

    _kind = "sphereface"


class NormalizedSoftmaxLoss(_ClassifierLoss, pml_losses.NormalizedSoftmaxLoss):
    """PML's ``NormalizedSoftmaxLoss(num_classes, embedding_size, temperature=0.05)``."""

    _kind = "normalized_softmax"
    _distance = pml_distances.DotProductSimilarity

    def _library_can(self) -> bool:
        return float(self.temperature) != 0 and super()._library_can()

    def _options(self) -> Dict[str, Any]:
        return dict(temperature=float(self.temperature))


class ProxyNCALoss(_ClassifierLoss, pml_losses.ProxyNCALoss):
    """PML's ``ProxyNCALoss(num_classes, embedding_size, softmax_scale=1)`` (``proxies``
    ``(num_classes, embedding_size)``): a row whose probability is 0 in f32 leaves the mean,
    as PML drops it."""

    _kind = "proxy_nca"
    _weights = "proxies"
    _distance = pml_distances.LpDistance
    _power = 2

    def _options(self) -> Dict[str, Any]:
        return dict(softmax_scale=float(self.softmax_scale))


class ProxyAnchorLoss(_ClassifierLoss, pml_losses.ProxyAnchorLoss):
    """PML's ``ProxyAnchorLoss(num_classes, embedding_size, margin=0.1, alpha=32)``
    (``proxies`` ``(num_classes, embedding_size)``): per class, a log-sum-exp over the batch,
    one pass over tiles of classes (PML forms the ``(batch, classes)`` matrices)."""

    _kind = "proxy_anchor"
    _weights = "proxies"
    _default_reducer = pml_reducers.DivisorReducer

    def _options(self) -> Dict[str, Any]:
        return dict(margin=float(self.margin), alpha=float(self.alpha))


class SoftTripleLoss(_ClassifierLoss, pml_losses.SoftTripleLoss):
    """PML's ``SoftTripleLoss(num_classes, embedding_size, centers_per_class=10, la=20,
    gamma=0.1, margin=0.01)`` (``fc`` ``(embedding_size, num_classes · centers_per_class)``)."""

    _kind = "soft_triple"
    _weights = "fc"

    def _options(self) -> Dict[str, Any]:
        # PML keeps 1 / gamma.
        return dict(
            centres=int(self.centers_per_class), la=float(self.la),
            gamma=float(1.0 / self.gamma), margin=float(self.margin),
        )
