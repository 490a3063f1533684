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
import os
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


def _held(loss: Any) -> Tuple[str, Optional[int], torch.Tensor, int, bool]:
    """``loss``'s kind, centres option, weights, classes held and whether classes are rows."""
    weights = getattr(loss, loss._weights)
    centres = loss._options().get("centres")
    per = int(centres or 1)
    on_rows = loss._weights == "proxies"
    if weights.dim() != 2 or int(weights.shape[0 if on_rows else 1]) % per:
        raise ValueError(
            f"{type(loss).__name__}.{loss._weights} of shape {tuple(weights.shape)} does not "
            f"hold whole classes of {per} centres"
        )
    return loss._kind, centres, weights, int(weights.shape[0 if on_rows else 1]) // per, on_rows


def _spread(loss: Any) -> bool:
    """Whether every rank takes part (a distributed loss under an initialised group)."""
    return getattr(loss, "distributed", None) is not None and dist.is_initialized()


def _placement(loss: Any, held: int, group: Optional[Any]) -> Tuple[int, int, bool]:
    """This rank's first class, the classes over every rank, and whether this rank writes
    (sharded: every rank its own classes, in rank order; otherwise rank 0 the whole)."""
    if getattr(loss, "distributed", None) != "sharded":
        writes = not dist.is_initialized() or dist.get_rank(group) == 0
        return 0, held, writes
    counts: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(counts, held, group=group)
    rank = dist.get_rank(group)
    return int(sum(counts[:rank])), int(sum(counts)), True


def _agree(loss: Any, error: Optional[str], group: Optional[Any], what: str) -> None:
    """Raises on every rank of a distributed loss when any rank failed (named), so that no
    rank waits for one that gave up, or goes on half done; on one process, nothing (its own
    failure was raised where it happened)."""
    errors = [error]
    if _spread(loss):
        errors = [None] * dist.get_world_size(group)
        dist.all_gather_object(errors, error, group=group)
    failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None]
    if failed:
        raise RuntimeError(f"{what} the class weights failed on " + "; ".join(failed))


def _attempt(loss: Any, step: Any) -> Tuple[Any, Optional[str]]:
    """``step()``, or on a distributed loss its failure as text for :func:`_agree` (on one
    process the failure is raised as it is)."""
    try:
        return step(), None
    except Exception as e:  # noqa: BLE001 - every rank must hear of it
        if not _spread(loss):
            raise
        return None, repr(e)


def _settings(optimizer: Any, weights: torch.Tensor) -> Tuple[Tuple[str, List[float]], int, list]:
    """``optimizer``'s settings for ``weights`` as the library stores them, its steps and its
    buffers (float32, the weights' layout). torch's SGD counts no steps: one is stored once it
    keeps a momentum buffer."""
    if optimizer is None:
        # No optimizer: plain SGD at rate 0, no state (a load then restores the weights only).
        return ("sgd", [0.0, 0.0, 0.0, 0.0, 0.0]), 0, []
    if not isinstance(optimizer, (torch.optim.SGD, torch.optim.AdamW)):
        raise TypeError(
            "the optimizer must be torch.optim.SGD or torch.optim.AdamW, got "
            f"{type(optimizer).__name__}"
        )
    groups = [g for g in optimizer.param_groups if any(p is weights for p in g["params"])]
    if not groups:
        raise ValueError("the optimizer does not hold the loss's weights")
    g, state = groups[0], optimizer.state.get(weights, {})
    array = lambda t: t.detach().to("cpu", torch.float32).contiguous().numpy()
    if g.get("maximize", False):
        raise ValueError("an optimizer with maximize=True has no counterpart in the library")
    if isinstance(optimizer, torch.optim.AdamW):
        if g.get("amsgrad", False):
            raise ValueError("AdamW(amsgrad=True) has no counterpart in the library")
        b1, b2 = g["betas"]
        settings = ("adamw", [float(g["lr"]), float(b1), float(b2), float(g["eps"]),
                              float(g["weight_decay"])])
        if "exp_avg" not in state:
            return settings, 0, []
        return settings, int(state["step"]), [array(state["exp_avg"]), array(state["exp_avg_sq"])]
    settings = ("sgd", [float(g["lr"]), float(g["momentum"]), float(g["dampening"]),
                        float(g["weight_decay"]), float(bool(g["nesterov"]))])
    buffer = state.get("momentum_buffer")
    return (settings, 0, []) if buffer is None else (settings, 1, [array(buffer)])


def save_class_weights(
    loss: Any, directory: str, optimizer: Any = None, group: Optional[Any] = None
) -> None:
    """Saves a class-weight drop-in's weights (``W``, ``fc`` or ``proxies``), and ``optimizer``'s
    state for them (``torch.optim.SGD`` or ``AdamW``), as a checkpoint of the library's format
    in ``directory`` (made if missing; every rank's on a filesystem they share): one shard per
    rank of a ``distributed="sharded"`` loss (each rank its own classes, in rank order), rank
    0's whole weights otherwise, then the manifest, every file written atomically (until the
    manifest is, a load finds the checkpoint before; then the previous checkpoint's shards are
    removed). Every rank of a distributed loss calls it at once; a failure on any rank raises
    ``RuntimeError`` on every rank. The weights and buffers are stored in float32 (float64
    weights are rounded). A checkpoint saved on N ranks loads on any number
    (:func:`load_class_weights`), and ``wml weights export`` streams it into one ``.npy`` for
    inference. Without ``optimizer`` no state is saved."""
    from . import _native

    # Every rank checks its weights and optimizer before the first exchange, so that all fail
    # alike where one would.
    def check() -> Any:
        held = _held(loss)
        return held, _settings(optimizer, held[2])

    checked, error = _attempt(loss, check)
    _agree(loss, error, group, "saving")
    (kind, centres, weights, held, _), (settings, steps, buffers) = checked
    first, classes, writes = _placement(loss, held, group)

    def write() -> Any:
        if not (writes and held > 0):
            return None
        os.makedirs(directory, exist_ok=True)
        array = weights.detach().to("cpu", torch.float32).contiguous().numpy()
        return _native.save_weights_shard(
            loss.context, directory, kind, centres, classes, first, array, settings, steps, buffers
        )

    record, error = _attempt(loss, write)
    _agree(loss, error, group, "saving")
    records = [record]
    if _spread(loss):
        records = [None] * dist.get_world_size(group)
        dist.all_gather_object(records, record, group=group)
    error = None
    if writes and (not _spread(loss) or dist.get_rank(group) == 0):
        _, error = _attempt(
            loss,
            lambda: _native.save_weights_manifest(
                directory, classes, [r for r in records if r is not None]
            ),
        )
    # No rank returns before the manifest names every shard, or without its failure.
    _agree(loss, error, group, "saving")


def load_class_weights(
    loss: Any, directory: str, optimizer: Any = None, group: Optional[Any] = None
) -> None:
    """Loads this rank's classes of the checkpoint in ``directory`` into a class-weight
    drop-in's weights, in place (a ``distributed="sharded"`` loss: the classes its weights hold,
    after the earlier ranks'; otherwise every class), and with ``optimizer`` the state saved
    with them into its state for the weights, cut the same way: a checkpoint saved on N ranks
    loads on M, and with float32 weights the next step is the unbroken run's. The optimizer's
    own settings (its learning rate) stay as they are; it must be of the saved kind (SGD or
    AdamW) where a state was saved. Raises ``ValueError`` when the checkpoint's classes are
    not the losses' or its state not the optimizer's, and the library's errors for a damaged
    or foreign checkpoint, with nothing changed; on a distributed loss a failure on any rank
    raises ``RuntimeError`` (naming it) on every rank, and no rank changes anything."""
    from . import _native

    checked, error = _attempt(loss, lambda: _held(loss))
    _agree(loss, error, group, "loading")
    kind, centres, weights, held, _ = checked
    first, classes, _ = _placement(loss, held, group)

    def read() -> Any:
        saved = _native.checkpoint_classes(directory)
        if saved != classes:
            raise ValueError(
                f"the checkpoint in {directory!r} holds {saved} classes; the loss's weights "
                f"hold {classes}"
            )
        w, _, (name, _), steps, buffers = _native.load_weights(
            loss.context, directory, kind, centres, first, first + held
        )
        group_of = None
        if optimizer is not None:
            mine, _, _ = _settings(optimizer, weights)
            if buffers and mine[0] != name:
                raise ValueError(
                    f"the checkpoint holds {name}'s state; the optimizer is "
                    f"{type(optimizer).__name__}"
                )
            group_of = next(
                g for g in optimizer.param_groups if any(p is weights for p in g["params"])
            )
        return w, name, steps, buffers, group_of

    loaded, error = _attempt(loss, read)
    # Every rank read its part, or none changes anything.
    _agree(loss, error, group, "loading")
    w, name, steps, buffers, group_of = loaded
    with torch.no_grad():
        weights.copy_(torch.from_numpy(w).to(weights.device, weights.dtype))
    if optimizer is None:
        return
    state = optimizer.state[weights]
    state.clear()
    like = lambda a: torch.from_numpy(a).to(weights.device, weights.dtype)
    if name == "sgd" and buffers:
        state["momentum_buffer"] = like(buffers[0])
    elif name == "adamw" and buffers:
        # Where torch keeps it: on the weights' device for fused and capturable AdamW.
        on_device = bool(group_of.get("fused")) or bool(group_of.get("capturable"))
        device = weights.device if on_device else "cpu"
        state["step"] = torch.tensor(float(steps), dtype=torch.float32, device=device)
        state["exp_avg"], state["exp_avg_sq"] = like(buffers[0]), like(buffers[1])
