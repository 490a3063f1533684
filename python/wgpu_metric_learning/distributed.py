"""The losses with class weights over ``torch.distributed``: the classes split over the
ranks, the library computing each rank's part and torch's collectives moving only the rows,
their per-row statistics and their gradients (``classifier_loss_sharded``).

The drop-ins take it with ``distributed="replicated"`` (every rank holds the whole ``W``,
broadcast from rank 0 at the first call; its gradient, whole and the same on every rank, is
the single process's) or ``distributed="sharded"`` (each rank's ``W`` holds its own classes,
contiguous, in rank order; ``labels`` number every rank's classes). Every rank must call the
loss at once. The embeddings' gradient is the single process's times the world size, so that
DDP's averaging of the backbone's gradients gives exactly the single process's; the loss is
the single process's on the concatenated batch, on every rank.
"""

from __future__ import annotations

import hashlib
from typing import Any, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist


class TorchCollectives:
    """The exchanges ``classifier_loss_sharded`` asks for, on a ``torch.distributed`` process
    group (gloo on the CPU; NCCL on the current CUDA device)."""

    def __init__(self, group: Optional[Any] = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.nccl = dist.get_backend(group) == "nccl"
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")
        )

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        array = np.ascontiguousarray(values, dtype=np.float64)
        return torch.from_numpy(array).to(self.device)

    def all_gather(self, values: np.ndarray) -> np.ndarray:
        """Every rank's ``values`` (the same length on each), in rank order."""
        t = self._tensor(values)
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts).cpu().numpy()

    def reduce_scatter(self, values: np.ndarray, block: int) -> np.ndarray:
        """Block ``rank`` of the sum over the ranks of ``values`` (``size · block`` of them)."""
        t = self._tensor(values)
        if self.nccl:
            out = torch.empty(block, dtype=t.dtype, device=self.device)
            dist.reduce_scatter_tensor(out, t, group=self.group)
            return out.cpu().numpy()
        # gloo has no reduce-scatter: the sum everywhere, of which this rank keeps its block.
        dist.all_reduce(t, group=self.group)
        return t[self.rank * block:(self.rank + 1) * block].cpu().numpy()

    def gather_rows(self, rows: np.ndarray) -> Tuple[np.ndarray, List[int]]:
        """Every rank's ``rows`` (any number of them, the same width), in rank order, and how
        many each rank has."""
        width = rows.shape[1]
        counts = self.all_gather(np.array([rows.shape[0]], np.float64)).astype(np.int64)
        most = int(counts.max())
        padded = np.zeros((most, width), np.float64)
        padded[:rows.shape[0]] = rows
        every = self.all_gather(padded.ravel()).reshape(self.size, most, width)
        whole = np.concatenate([every[r, :counts[r]] for r in range(self.size)])
        return whole, [int(c) for c in counts]


def check_replicas(weights: torch.Tensor, group: Optional[Any] = None) -> None:
    """Raises ``RuntimeError`` on every rank when the ranks' ``weights`` differ: a 48-bit
    checksum of their bytes (exact in the float64 the exchange carries) compared over the
    group, naming a rank that differs."""
    data = weights.detach().cpu().contiguous().numpy().tobytes()
    mine = int.from_bytes(hashlib.blake2b(data, digest_size=6).digest(), "little")
    engine = TorchCollectives(group)
    every = engine.all_gather(np.array([float(mine)], np.float64)).astype(np.int64)
    for rank, theirs in enumerate(every):
        if int(theirs) != mine:
            raise RuntimeError(
                f"replicated weights differ between ranks: checksum {mine:012x} on rank "
                f"{engine.rank}, {int(theirs):012x} on rank {rank}"
            )


def shard_of(classes: int, rank: int, size: int) -> Tuple[int, int]:
    """Rank ``rank``'s classes of ``classes`` split evenly over ``size`` ranks: ``(first,
    end)``."""
    return classes * rank // size, classes * (rank + 1) // size


def sharded_call(
    context: Any,
    embeddings: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    kind: str,
    mode: str,
    per: int,
    on_rows: bool,
    group: Optional[Any] = None,
    **options: Any,
):
    """One rank's part of the loss ``kind``: ``(loss, count, grad of this rank's rows (times
    the world size), the weights' gradient (whole when replicated, this rank's classes when
    sharded))``."""
    from . import _native

    engine = TorchCollectives(group)
    x, rows_of = engine.gather_rows(embeddings.astype(np.float64))
    y, _ = engine.gather_rows(labels.astype(np.float64)[:, None])
    centres = weights.shape[0] if on_rows else weights.shape[1]
    if mode == "replicated":
        classes = centres // per
        first, end = shard_of(classes, engine.rank, engine.size)
        cols = slice(first * per, end * per)
        mine = weights[cols] if on_rows else weights[:, cols]
    else:
        counts = engine.all_gather(np.array([centres // per], np.float64)).astype(np.int64)
        first, classes = int(counts[:engine.rank].sum()), int(counts.sum())
        mine = weights
    out = _native.classifier_loss_sharded(
        context, np.ascontiguousarray(x, np.float32), y[:, 0].astype(np.int64),
        np.ascontiguousarray(mine, np.float32), kind, first, classes, rows_of, engine, **options,
    )
    grad = out[2] * np.float32(engine.size)
    weight_grad = out[3]
    if mode == "replicated":
        # Every rank's classes' gradient, as rows of centres, then back to the layout.
        rows = weight_grad if on_rows else weight_grad.T
        whole, _ = engine.gather_rows(rows.astype(np.float64))
        whole = whole.astype(np.float32)
        weight_grad = np.ascontiguousarray(whole if on_rows else whole.T)
    return out[0], out[1], grad, weight_grad
