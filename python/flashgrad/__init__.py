"""flashgrad: exact, memory-efficient attention with a fused backward, on CPUs.

Array API (numpy, torch or any DLPack / buffer-protocol array; no copies, strides passed through):

    out, lse = flashgrad.forward(q, k, v, causal=True)
    dq, dk, dv, dsinks, dbias = flashgrad.backward(q, k, v, out, lse, dout, causal=True)

PyTorch autograd functions with flash-attn 2.x's signatures, and torch 2's
scaled_dot_product_attention, live in flashgrad.torch:

    from flashgrad.torch import flash_attn_func, scaled_dot_product_attention

The binding is pybind11 over the C++ API (see python/README.md for why).
"""
from ._core import (
    Grads,
    backward,
    backward_workspace_bytes,
    dropout_keep_mask,
    forward,
    forward_workspace_bytes,
    isa,
    max_threads,
    merge,
    thread_runner,
    use_openmp_runtime,
)

__version__ = "0.1.0"

__all__ = [
    "Grads",
    "forward",
    "backward",
    "dropout_keep_mask",
    "forward_workspace_bytes",
    "backward_workspace_bytes",
    "merge",
    "isa",
    "max_threads",
    "thread_runner",
    "use_openmp_runtime",
]
