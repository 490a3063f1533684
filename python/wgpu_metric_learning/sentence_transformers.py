"""Drop-ins for sentence-transformers' in-batch losses (6.x), with their constructors and
call signatures, whose value and embedding gradients come from the library:

- :class:`MultipleNegativesRankingLoss` and :class:`MultipleNegativesSymmetricRankingLoss`
  (subclasses of sentence-transformers' own);
- :class:`CachedMultipleNegativesRankingLoss`: GradCache as sentence-transformers runs it
  (mini-batches embedded without a graph, the loss and the embeddings' gradients, then each
  mini-batch embedded again with its graph and its ``backward`` run at once), the loss and
  gradients of the whole batch from the library in one pass;
- :class:`MatryoshkaLoss`: around one of the drop-ins above, **every width in one pass** of
  the library (the dot product at a width is a prefix of the full one, and so is each norm),
  where sentence-transformers runs the whole loss once per width. Around a cached drop-in,
  peak memory stays one mini-batch's graph plus ``O(B · d)``, whatever the number of widths.

What the library runs: cosine similarity (``cos_sim``), ``directions=("query_to_doc",)``
(any ``partition_mode``), or the symmetric ``("query_to_doc", "doc_to_query")`` with
``partition_mode="per_direction"``, without hardness weighting and without
``gather_across_devices``. Any other option runs sentence-transformers' own code (and,
under :class:`MatryoshkaLoss`, its pass per width). Tensors come back on the caller's device
and dtype; CUDA tensors go through host memory. The loss drop-ins also take ``backend``,
``budget`` (bytes) or a ready ``context``, as the PML drop-ins do; :class:`MatryoshkaLoss`
runs on the context of the loss it wraps.

Example::

    from wgpu_metric_learning.sentence_transformers import (
        CachedMultipleNegativesRankingLoss, MatryoshkaLoss)

    inner = CachedMultipleNegativesRankingLoss(model, mini_batch_size=64)
    loss = MatryoshkaLoss(model, inner, [768, 512, 256, 128, 64])
"""

from __future__ import annotations

import random
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

try:
    import torch
    from sentence_transformers.base.losses.merged_forward import embed_columns
    from sentence_transformers.sentence_transformer import losses as st_losses
    from sentence_transformers.sentence_transformer.losses.matryoshka import (
        CachedLossDecorator,
    )
    from sentence_transformers.util import cos_sim
except ImportError as missing:
    raise ImportError(
        "wgpu_metric_learning.sentence_transformers needs torch and sentence-transformers 6 "
        "(pip install torch sentence-transformers)"
    ) from missing

from . import Context, _native
from ._torch import _OnContext, _emb, _loss_tensor

__all__ = [
    "CachedMultipleNegativesRankingLoss",
    "MatryoshkaLoss",
    "MultipleNegativesRankingLoss",
    "MultipleNegativesSymmetricRankingLoss",
]

#: Matryoshka widths and weights of one call.
_Widths = Tuple[List[int], List[float]]


def _library_runs(loss: Any) -> bool:
    """Whether the library computes ``loss``'s options (module docs); else
    sentence-transformers' own code runs."""
    if loss.similarity_fct is not cos_sim or loss.gather_across_devices:
        return False
    if loss.hardness_mode is not None and loss.hardness_strength > 0.0:
        return False
    directions = tuple(loss.directions)
    if directions == ("query_to_doc",):
        return True
    symmetric = sorted(directions) == ["doc_to_query", "query_to_doc"]
    return symmetric and loss.partition_mode == "per_direction"


def _in_batch(
    loss: Any, context: Context, queries: torch.Tensor, docs: Sequence[torch.Tensor],
    widths: Optional[_Widths],
) -> torch.Tensor:
    """``loss`` of ``queries`` ``(b, d)`` against ``docs`` (positives, then hard negatives,
    each ``(b, d)``) as a tensor whose ``backward`` reaches every input; with ``widths``, the
    weighted sum over the Matryoshka widths."""
    kw: dict = {"scale": float(loss.scale)}
    if widths is not None:
        kw.update(matryoshka_dims=list(widths[0]), matryoshka_weights=list(widths[1]))
    q = _emb(queries, "queries")
    d = np.concatenate([_emb(x, "documents") for x in docs])
    out = _native.multiple_negatives_ranking_loss(context, q, d, **kw)
    value, grad_q, grad_d = out[0], out[3], out[4]
    if "doc_to_query" in loss.directions:
        # Per direction: each positive document against every query, the two averaged.
        back = _native.multiple_negatives_ranking_loss(context, d[: len(q)], q, **kw)
        value = (value + back[0]) / 2
        grad_q = (grad_q + back[4]) / 2
        grad_d = grad_d / 2
        grad_d[: len(q)] += back[3] / 2
    bounds = np.cumsum([0] + [len(x) for x in docs])
    pairs = [(queries, grad_q)]
    pairs += [(x, grad_d[a:b]) for x, a, b in zip(docs, bounds[:-1], bounds[1:])]
    return _loss_tensor(value, pairs)


def _pick(dims: Sequence[int], weights: Sequence[float], n_dims_per_step: int, sort: bool) -> _Widths:
    """The widths of one step: all, or ``n_dims_per_step`` drawn as sentence-transformers
    draws them (``random.sample``; sorted where its uncached path sorts)."""
    indices = list(range(len(dims)))
    if 0 < n_dims_per_step < len(indices):
        indices = random.sample(indices, n_dims_per_step)
        if sort:
            indices.sort()
    return [int(dims[i]) for i in indices], [float(weights[i]) for i in indices]


class _InBatch(_OnContext):
    """The uncached drop-ins' loss: the library's where it runs the options."""

    def compute_loss_from_embeddings(self, embeddings: List[torch.Tensor], labels: Any) -> torch.Tensor:
        if len(embeddings) < 2 or not _library_runs(self):
            return super().compute_loss_from_embeddings(embeddings, labels)  # type: ignore[misc]
        return _in_batch(self, self.context, embeddings[0], embeddings[1:], None)


class MultipleNegativesRankingLoss(_InBatch, st_losses.MultipleNegativesRankingLoss):
    """sentence-transformers' ``MultipleNegativesRankingLoss``, same arguments, computed by
    the library in row blocks (the ``(b, b · columns)`` similarity matrix never exists whole)
    for the options of the module docs."""

    def __init__(
        self,
        model: Any,
        scale: float = 20.0,
        similarity_fct: Callable[..., Any] = cos_sim,
        gather_across_devices: bool = False,
        directions: Tuple[str, ...] = ("query_to_doc",),
        partition_mode: str = "joint",
        hardness_mode: Optional[str] = None,
        hardness_strength: float = 0.0,
        *,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
    ) -> None:
        super().__init__(
            model, scale=scale, similarity_fct=similarity_fct,
            gather_across_devices=gather_across_devices, directions=directions,
            partition_mode=partition_mode, hardness_mode=hardness_mode,
            hardness_strength=hardness_strength,
        )
        self._set_context(context, backend, budget)


with warnings.catch_warnings():
    # Subclassing the deprecated class warns at import; making one still warns, as theirs.
    warnings.simplefilter("ignore", DeprecationWarning)

    class MultipleNegativesSymmetricRankingLoss(
        _InBatch, st_losses.MultipleNegativesSymmetricRankingLoss
    ):
        """sentence-transformers' (deprecated) ``MultipleNegativesSymmetricRankingLoss``,
        same arguments: the mean of the queries' loss against the documents and the positive
        documents' loss against the queries, both from the library."""

        def __init__(
            self,
            model: Any,
            scale: float = 20.0,
            similarity_fct: Callable[..., Any] = cos_sim,
            gather_across_devices: bool = False,
            *,
            backend: str = "auto",
            budget: Optional[int] = None,
            context: Optional[Context] = None,
        ) -> None:
            super().__init__(
                model, scale=scale, similarity_fct=similarity_fct,
                gather_across_devices=gather_across_devices,
            )
            self._set_context(context, backend, budget)


class CachedMultipleNegativesRankingLoss(_OnContext, st_losses.CachedMultipleNegativesRankingLoss):
    """sentence-transformers' ``CachedMultipleNegativesRankingLoss``, same arguments and
    GradCache steps; the loss and the embeddings' gradients of the whole batch come from the
    library in one pass (and, under :class:`MatryoshkaLoss`, of every width in that pass)."""

    def __init__(
        self,
        model: Any,
        scale: float = 20.0,
        similarity_fct: Callable[..., Any] = cos_sim,
        mini_batch_size: int = 32,
        mini_batch_num_tokens: Optional[int] = None,
        gather_across_devices: bool = False,
        directions: Tuple[str, ...] = ("query_to_doc",),
        partition_mode: str = "joint",
        show_progress_bar: bool = False,
        hardness_mode: Optional[str] = None,
        hardness_strength: float = 0.0,
        *,
        backend: str = "auto",
        budget: Optional[int] = None,
        context: Optional[Context] = None,
    ) -> None:
        super().__init__(
            model, scale=scale, similarity_fct=similarity_fct,
            mini_batch_size=mini_batch_size, mini_batch_num_tokens=mini_batch_num_tokens,
            gather_across_devices=gather_across_devices, directions=directions,
            partition_mode=partition_mode, show_progress_bar=show_progress_bar,
            hardness_mode=hardness_mode, hardness_strength=hardness_strength,
        )
        self._set_context(context, backend, budget)
        # Set by MatryoshkaLoss: its widths, weights and `n_dims_per_step`.
        self._matryoshka: Optional[Tuple[Sequence[int], Sequence[float], int]] = None

    def calculate_loss(
        self, reps: List[List[torch.Tensor]], labels: Optional[torch.Tensor] = None, *,
        with_backward: bool = False,
    ) -> torch.Tensor:
        if not _library_runs(self):
            fn = super().calculate_loss
            if self._matryoshka is not None:
                # sentence-transformers' own pass per width.
                fn = CachedLossDecorator(fn, *self._matryoshka)
            return fn(reps, labels, with_backward=with_backward)
        widths = None if self._matryoshka is None else _pick(*self._matryoshka, sort=False)
        queries = torch.cat(reps[0])
        docs = [torch.cat(column) for column in reps[1:]]
        loss = _in_batch(self, self.context, queries, docs, widths)
        if not with_backward:
            return loss
        # The embeddings' gradients, as sentence-transformers' per-mini-batch backward
        # leaves them.
        loss.backward()
        return loss.detach()


class MatryoshkaLoss(st_losses.MatryoshkaLoss):
    """sentence-transformers' ``MatryoshkaLoss``, same arguments. Around one of this
    module's drop-ins whose options the library runs, every width is taken in one pass of the
    library (loss and gradients of each truncation from prefix products; module docs);
    around any other loss, sentence-transformers' own pass per width."""

    def __init__(
        self,
        model: Any,
        loss: torch.nn.Module,
        matryoshka_dims: Sequence[int],
        matryoshka_weights: Optional[Sequence[float]] = None,
        n_dims_per_step: int = -1,
    ) -> None:
        super().__init__(model, loss, matryoshka_dims, matryoshka_weights, n_dims_per_step)
        if isinstance(loss, CachedMultipleNegativesRankingLoss):
            # sentence-transformers wrapped its `calculate_loss` for a pass per width; the
            # drop-in takes the widths itself (and wraps its fallback the same way).
            if isinstance(loss.__dict__.get("calculate_loss"), CachedLossDecorator):
                del loss.calculate_loss
            loss._matryoshka = (
                list(self.matryoshka_dims), list(self.matryoshka_weights), n_dims_per_step
            )

    def forward(self, sentence_features: Any, labels: Any) -> torch.Tensor:
        if self.uses_gradient_cache or not isinstance(self.loss, _InBatch):
            return super().forward(sentence_features, labels)
        if not _library_runs(self.loss):
            return super().forward(sentence_features, labels)
        features = list(sentence_features)
        embeddings = embed_columns(self.model, features)
        if len(embeddings) < 2:
            return super().forward(features, labels)
        widths = _pick(self.matryoshka_dims, self.matryoshka_weights, self.n_dims_per_step, sort=True)
        return _in_batch(self.loss, self.loss.context, embeddings[0], embeddings[1:], widths)
