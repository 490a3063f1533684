"""What the torch drop-ins share (:mod:`wgpu_metric_learning.pml` and
:mod:`wgpu_metric_learning.sentence_transformers`): their contexts, tensors as the library's
arrays, and loss values whose gradients the library computed."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from . import Context, default_context
from . import _matrix as _np_matrix

_contexts: Dict[Tuple[str, Optional[int]], Context] = {}
_contexts_lock = threading.Lock()


def _shared_context(context: Optional[Context], backend: str, budget: Optional[int]) -> Context:
    """The given context, or one shared per (backend, budget) so drop-ins share a device."""
    if context is not None:
        return context
    if backend == "auto" and budget is None:
        return default_context()
    with _contexts_lock:
        key = (backend, budget)
        if key not in _contexts:
            _contexts[key] = Context(backend=backend, budget=budget)
        return _contexts[key]


def _emb(x: torch.Tensor, what: str) -> np.ndarray:
    return _np_matrix(x.detach().to("cpu", torch.float32), what)


class _OnContext:
    """A drop-in's context: the one given, or one shared per (backend, budget), made on first
    use."""

    def _set_context(self, context: Optional[Context], backend: str, budget: Optional[int]) -> None:
        self._context = context
        self._backend, self._budget = backend, budget

    @property
    def context(self) -> Context:
        self._context = _shared_context(self._context, self._backend, self._budget)
        return self._context


class _Gradients(torch.autograd.Function):
    """A loss value whose gradients the library already computed: ``backward`` scales them by
    the incoming gradient. The inputs are the tensors the gradients belong to."""

    @staticmethod
    def forward(ctx, value, grads, *inputs):  # noqa: D401 - torch's signature
        ctx.grads = grads
        like = inputs[0]
        return torch.tensor(value, dtype=like.dtype, device=like.device)

    @staticmethod
    def backward(ctx, grad_output):
        out = [None, None]
        for g in ctx.grads:
            out.append(None if g is None else g * grad_output)
        return tuple(out)


def _loss_tensor(value: float, pairs) -> torch.Tensor:
    """``value`` as a 0-d tensor whose backward hands each ``(tensor, numpy gradient)`` of
    ``pairs`` its gradient (in the tensor's dtype, on its device)."""
    inputs = [t for t, _ in pairs]
    grads = [
        None if g is None else torch.from_numpy(g).to(device=t.device, dtype=t.dtype)
        for t, g in pairs
    ]
    return _Gradients.apply(value, grads, *inputs)
