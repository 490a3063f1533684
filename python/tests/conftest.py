import os

import pytest

# Before any adapter is enumerated: Mesa's GL driver (llvmpipe, as in CI) loads its libLLVM
# into the global symbol scope, and triton's libtriton.so (loaded by torch._dynamo, which
# transformers imports) then runs its LLVM's static initialisers against Mesa's and crashes.
# Loaded first, triton keeps its own. (Users: the same order, or WGPU_BACKEND=vulkan.)
try:
    import torch._dynamo  # noqa: F401
except ImportError:
    pass

import wgpu_metric_learning as wml  # noqa: E402


def _backends():
    """The native CPU path always; the wgpu path where an adapter exists (lavapipe in CI), and
    required under WML_REQUIRE_GPU=1 as for the Rust tests."""
    found = ["cpu"]
    if wml.list_adapters():
        found.append("gpu")
    elif os.environ.get("WML_REQUIRE_GPU") == "1":
        raise RuntimeError("WML_REQUIRE_GPU=1 but wgpu finds no adapter")
    return found


BACKENDS = _backends()
_contexts = {}


@pytest.fixture(params=BACKENDS)
def ctx(request):
    """One context per backend for the whole session (a device is costly to make)."""
    if request.param not in _contexts:
        _contexts[request.param] = wml.Context(backend=request.param)
    c = _contexts[request.param]
    assert c.path == ("wgpu" if request.param == "gpu" else "native_cpu")
    return c
