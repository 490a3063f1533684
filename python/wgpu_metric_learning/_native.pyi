"""Type stubs of the extension module. Its functions take arguments already converted by the
package (``float32`` 2-D arrays, ``int64`` labels); call them through ``wgpu_metric_learning``."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union, final, overload

import numpy as np
import numpy.typing as npt

_F32 = npt.NDArray[np.float32]
_I64 = npt.NDArray[np.int64]
_U32 = npt.NDArray[np.uint32]
_SelfExclusion = Union[None, str, _U32]
_Refs = Union[None, "MemoryBank", Tuple[Optional[_F32], _I64]]

__version__: str
__all__ = [
    "__version__",
    "Context",
    "MemoryBank",
    "TripletChunks",
    "list_adapters",
    "pairwise_distances",
    "knn",
    "mine_triplets",
    "count_triplets",
    "all_pairs",
    "pair_margin_pairs",
    "multi_similarity_pairs",
    "batch_easy_hard_pairs",
    "batch_hard_triplets",
    "angular_triplets",
    "distance_weighted_triplets",
    "hdc_pairs",
    "uniform_histogram_pairs",
    "accuracy",
    "kmeans",
    "normalized_mutual_info",
    "adjusted_mutual_info",
    "triplet_margin_loss",
    "ntxent_loss",
    "multiple_negatives_ranking_loss",
    "contrastive_loss",
    "multi_similarity_loss",
    "supcon_loss",
    "circle_loss",
    "nca_loss",
    "generalized_lifted_structure_loss",
    "margin_loss",
    "fast_ap_loss",
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
    "classifier_loss_sharded",
    "sampled_classes",
    "save_weights_shard",
    "save_weights_manifest",
    "load_weights",
    "checkpoint_classes",
    "snr_contrastive_loss",
    "dynamic_soft_margin_loss",
]

@final
class Context:
    """One device (or the native CPU path) and its memory budget.

    ``backend``: ``"auto"`` (a hardware GPU if any, else the CPU path), ``"gpu"``/``"wgpu"``,
    ``"cpu"``/``"native"``, or one wgpu backend: ``"vulkan"``, ``"metal"``, ``"dx12"``,
    ``"gl"``. ``budget``: device bytes (default: a share of the device's memory).
    ``adapter``: an index into :func:`list_adapters` or part of a name. ``kernel_timing``:
    time every dispatch by GPU timestamps (see :meth:`transfers`)."""

    def __new__(
        cls,
        backend: str = "auto",
        budget: Optional[int] = None,
        adapter: Union[None, int, str] = None,
        fill_outputs_with_sentinel: bool = False,
        kernel_timing: bool = False,
    ) -> "Context": ...
    @property
    def path(self) -> str:
        """``"wgpu"`` or ``"native_cpu"``."""
    @property
    def device_name(self) -> str: ...
    def memory(self) -> Dict[str, int]:
        """``current_bytes``, ``peak_bytes`` and ``budget_bytes`` of tracked device memory."""
    def transfers(self) -> Dict[str, Any]:
        """``host_waits``, ``submissions``, ``bytes_up``, ``bytes_down`` so far; the host's
        ``upload_seconds``, ``wait_seconds``, ``readback_seconds`` and ``tune_seconds``; and
        ``kernels``: each kernel's ``dispatches`` and ``gpu_seconds`` (empty unless the
        context times kernels)."""
    def reset_peak(self) -> None: ...

def list_adapters() -> List[Dict[str, Any]]:
    """The adapters wgpu finds: ``index``, ``name``, ``backend``, ``device_type``, ``driver``,
    ``software``."""

@final
class MemoryBank:
    def __new__(cls, ctx: Context, capacity: int, dim: int) -> "MemoryBank": ...
    @staticmethod
    def load(ctx: Context, path: Union[str, PathLike[str]], capacity: int, dim: int) -> "MemoryBank": ...
    def save(self, path: Union[str, PathLike[str]]) -> int: ...
    def enqueue(
        self, embeddings: _F32, labels: _I64, mask: Optional[npt.NDArray[np.uint8]] = None
    ) -> Tuple[_U32, _I64, Union[str, _U32]]: ...
    def snapshot(self) -> Tuple[_F32, _I64]: ...
    def reset(self) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def head(self) -> int: ...
    @property
    def is_filled(self) -> bool: ...
    def __len__(self) -> int: ...

@final
class TripletChunks(Iterator[_U32]):
    def __new__(
        cls,
        ctx: Context,
        embeddings: Optional[_F32],
        labels: _I64,
        refs: Optional[Tuple[Optional[_F32], _I64]] = None,
        *,
        type_of_triplets: Optional[str] = None,
        margin: float = 0.2,
        distance: str = "euclidean",
        normalize: bool = True,
        self_exclusion: _SelfExclusion = None,
        max_chunk_triplets: int = 1 << 20,
    ) -> "TripletChunks": ...
    def __iter__(self) -> "TripletChunks": ...
    def __next__(self) -> _U32: ...
    @property
    def count(self) -> Optional[int]:
        """The total, once the iterator is exhausted."""
    def close(self) -> None: ...

def pairwise_distances(
    ctx: Context,
    queries: _F32,
    refs: Union[None, _F32, MemoryBank] = None,
    *,
    distance: str = "euclidean",
    normalize: bool = True,
) -> _F32: ...
def knn(
    ctx: Context,
    queries: _F32,
    refs: Union[None, _F32, MemoryBank] = None,
    *,
    k: int = 10,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> Tuple[_U32, _F32]: ...
def mine_triplets(
    ctx: Context,
    embeddings: Optional[_F32],
    labels: _I64,
    refs: _Refs = None,
    *,
    type_of_triplets: Optional[str] = None,
    margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> _U32: ...
def count_triplets(
    ctx: Context,
    embeddings: Optional[_F32],
    labels: _I64,
    refs: _Refs = None,
    *,
    type_of_triplets: Optional[str] = None,
    margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> int: ...
def all_pairs(
    ctx: Context, labels: _I64, refs: _Refs = None, *, self_exclusion: _SelfExclusion = None
) -> Tuple[_U32, _U32]: ...
def pair_margin_pairs(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    pos_margin: float = 0.2,
    neg_margin: float = 0.8,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> Tuple[_U32, _U32]: ...
def multi_similarity_pairs(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    epsilon: float = 0.1,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> Tuple[_U32, _U32]: ...
def batch_easy_hard_pairs(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    pos_strategy: str = "easy",
    neg_strategy: str = "semihard",
    allowed_pos_range: Optional[Tuple[float, float]] = None,
    allowed_neg_range: Optional[Tuple[float, float]] = None,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> Tuple[_U32, _U32]: ...
def batch_hard_triplets(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> _U32: ...
def angular_triplets(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    angle: float = 20.0,
    self_exclusion: _SelfExclusion = None,
) -> _U32: ...
def distance_weighted_triplets(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    cutoff: float = 0.5,
    nonzero_loss_cutoff: float = 1.4,
    seed: int = 0,
    self_exclusion: _SelfExclusion = None,
) -> _U32: ...
def hdc_pairs(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    filter_percentage: float = 0.5,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
) -> Tuple[_U32, _U32]: ...
def uniform_histogram_pairs(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    num_bins: int = 100,
    pos_per_bin: int = 10,
    neg_per_bin: int = 10,
    distance: str = "euclidean",
    normalize: bool = True,
    seed: int = 0,
    self_exclusion: _SelfExclusion = None,
) -> Tuple[_U32, _U32]: ...
def accuracy(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    k: Union[None, str, int] = None,
    distance: str = "squared_euclidean",
    normalize: bool = False,
    self_exclusion: _SelfExclusion = None,
    avg_of_avgs: bool = False,
    include: Optional[List[str]] = None,
    kmeans_seed: int = 1234,
    kmeans_iterations: int = 20,
) -> Dict[str, Any]: ...
def kmeans(
    ctx: Context,
    points: _F32,
    clusters: int,
    *,
    max_iterations: int = 20,
    tolerance: float = 0.0,
    seed: int = 1234,
    max_points_per_centroid: int = 256,
) -> Tuple[_F32, _U32, _F32, float, int]: ...
def normalized_mutual_info(labels_true: _I64, labels_pred: _I64) -> float: ...
def adjusted_mutual_info(labels_true: _I64, labels_pred: _I64) -> float: ...
def triplet_margin_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    margin: float = 0.05,
    type_of_triplets: Optional[str] = None,
    miner_margin: float = 0.2,
    distance: str = "euclidean",
    normalize: bool = True,
    smooth_loss: bool = False,
    swap: bool = False,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
@overload
def ntxent_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    temperature: float = 0.07,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
    matryoshka_dims: None = None,
    matryoshka_weights: None = None,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
@overload
def ntxent_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    temperature: float = 0.07,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
    matryoshka_dims: Sequence[int],
    matryoshka_weights: Optional[Sequence[float]] = None,
) -> Tuple[float, int, int, _F32, Optional[_F32], List[float]]: ...
@overload
def ntxent_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    temperature: float = 0.07,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
    matryoshka_dims: Optional[Sequence[int]] = None,
    matryoshka_weights: Optional[Sequence[float]] = None,
) -> Union[
    Tuple[float, int, int, _F32, Optional[_F32]],
    Tuple[float, int, int, _F32, Optional[_F32], List[float]],
]: ...
@overload
def multiple_negatives_ranking_loss(
    ctx: Context,
    anchors: _F32,
    candidates: _F32,
    *,
    scale: float = 20.0,
    matryoshka_dims: None = None,
    matryoshka_weights: None = None,
) -> Tuple[float, int, int, _F32, _F32]: ...
@overload
def multiple_negatives_ranking_loss(
    ctx: Context,
    anchors: _F32,
    candidates: _F32,
    *,
    scale: float = 20.0,
    matryoshka_dims: Sequence[int],
    matryoshka_weights: Optional[Sequence[float]] = None,
) -> Tuple[float, int, int, _F32, _F32, List[float]]: ...
@overload
def multiple_negatives_ranking_loss(
    ctx: Context,
    anchors: _F32,
    candidates: _F32,
    *,
    scale: float = 20.0,
    matryoshka_dims: Optional[Sequence[int]] = None,
    matryoshka_weights: Optional[Sequence[float]] = None,
) -> Union[
    Tuple[float, int, int, _F32, _F32], Tuple[float, int, int, _F32, _F32, List[float]]
]: ...
def contrastive_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def multi_similarity_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def supcon_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    temperature: float = 0.1,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def circle_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    m: float = 0.4,
    gamma: float = 80.0,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def nca_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    softmax_scale: float = 1.0,
    distance: str = "squared_euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def generalized_lifted_structure_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def margin_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    margin: float = 0.2,
    nu: float = 0.0,
    beta: float = 1.2,
    learn_beta: bool = False,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32], Optional[float]]: ...
def fast_ap_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    num_bins: int = 10,
    distance: str = "squared_euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def lifted_structure_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    neg_margin: float = 1.0,
    pos_margin: float = 0.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def histogram_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    n_bins: int = 100,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def tuplet_margin_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    margin: float = 5.73,
    scale: float = 64.0,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def intra_pair_variance_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    pos_eps: float = 0.01,
    neg_eps: float = 0.01,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def ranked_list_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    margin: float = 0.4,
    tn: float = 1.0,
    imbalance: float = 0.5,
    alpha: Optional[float] = None,
    tp: float = 0.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def threshold_consistent_margin_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    lambda_plus: float = 1.0,
    lambda_minus: float = 1.0,
    margin_plus: float = 0.9,
    margin_minus: float = 0.5,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def pnp_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    b: float = 2.0,
    alpha: float = 1.0,
    anneal: float = 0.01,
    variant: str = "O",
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def n_pairs_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    distance: str = "dot",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def instance_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    gamma: float = 64.0,
    distance: str = "cosine",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def angular_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    alpha: float = 40.0,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def classifier_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    weights: _F32,
    kind: str,
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
) -> Tuple[float, int, _F32, _F32, int]: ...
def classifier_loss_sharded(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    weights: _F32,
    kind: str,
    first_class: int,
    classes: int,
    rows_of: Sequence[int],
    collectives: Any,
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
) -> Tuple[float, int, _F32, _F32, int]: ...
def save_weights_shard(
    ctx: Context,
    directory: Union[str, PathLike[str]],
    kind: str,
    centres: Optional[int],
    classes: int,
    first_class: int,
    weights: _F32,
    optimizer: Tuple[str, Sequence[float]],
    steps: int,
    buffers: Sequence[_F32],
) -> Tuple[str, int, int, int, int]: ...
def save_weights_manifest(
    directory: Union[str, PathLike[str]], classes: int, records: Sequence[Tuple[str, int, int, int, int]]
) -> None: ...
def load_weights(
    ctx: Context,
    directory: Union[str, PathLike[str]],
    kind: str,
    centres: Optional[int],
    start: int,
    end: int,
) -> Tuple[_F32, int, Tuple[str, List[float]], int, List[_F32]]: ...
def checkpoint_classes(directory: Union[str, PathLike[str]]) -> int: ...
def sampled_classes(
    classes: int, labels: _I64, rate: float, seed: int, first_class: int = 0
) -> npt.NDArray[np.int64]: ...
def vicreg_loss(
    ctx: Context,
    embeddings: _F32,
    ref_emb: Optional[_F32] = None,
    *,
    invariance_lambda: float = 25.0,
    variance_mu: float = 25.0,
    covariance_v: float = 1.0,
    eps: float = 1e-4,
) -> Tuple[float, float, float, float, _F32, Optional[_F32]]: ...
def snr_contrastive_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    pos_margin: float = 0.0,
    neg_margin: float = 1.0,
    distance: str = "squared_euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32]]: ...
def dynamic_soft_margin_loss(
    ctx: Context,
    embeddings: _F32,
    labels: _I64,
    refs: _Refs = None,
    *,
    min_val: float = ...,  # -2.0 (pyo3 renders negative defaults as ...)
    num_bins: int = 10,
    momentum: float = 0.01,
    histogram: Optional[Sequence[float]] = None,
    distance: str = "euclidean",
    normalize: bool = True,
    self_exclusion: _SelfExclusion = None,
    ref_grad: bool = False,
) -> Tuple[float, int, int, _F32, Optional[_F32], List[float]]: ...
