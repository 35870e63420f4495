"""The array API (flashgrad.forward / backward) on numpy, torch and raw DLPack capsules."""
import os

import numpy as np
import pytest
import torch

import flashgrad
from conftest import attention_math


def data(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 9, 4, 8)).astype(dtype)
    k = rng.standard_normal((2, 13, 2, 8)).astype(dtype)
    v = rng.standard_normal((2, 13, 2, 6)).astype(dtype)
    return q, k, v


def test_numpy_forward_backward_match_reference():
    q, k, v = data()
    bias = np.random.default_rng(1).standard_normal((1, 4, 9, 13)).astype(np.float32)
    sinks = np.linspace(-1, 1, 4).astype(np.float32)
    kw = dict(causal=True, window_size=(6, -1), softcap=3.0, bias=bias, sinks=sinks)
    out, lse = flashgrad.forward(q, k, v, **kw)
    assert isinstance(out, np.ndarray) and out.shape == (2, 9, 4, 6) and lse.dtype == np.float64
    dout = np.random.default_rng(2).standard_normal(out.shape)
    g = flashgrad.backward(q, k, v, out, lse, dout, return_dbias=True, **kw)
    tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    tb = torch.from_numpy(bias).double().requires_grad_()
    ts = torch.from_numpy(sinks).double().requires_grad_()
    ref, ref_lse = attention_math(tq, tk, tv, causal=True, window=(6, -1), softcap=3.0, bias=tb, sinks=ts)
    ref.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(out, ref.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse.detach().numpy(), atol=1e-12)
    for got, want in zip(g, (tq.grad, tk.grad, tv.grad, ts.grad, tb.grad)):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-10)


def test_writes_into_given_arrays():
    q, k, v = data(np.float32)
    out = np.empty((2, 9, 4, 6), np.float32)
    lse_mem = np.empty((4, 2, 9), np.float32)  # lse as a transposed view of other memory
    lse = lse_mem.transpose(1, 0, 2)
    r_out, r_lse = flashgrad.forward(q, k, v, out=out, lse=lse)
    assert r_out is out and r_lse is lse
    new_out, new_lse = flashgrad.forward(q, k, v)
    assert np.array_equal(out, new_out) and np.array_equal(lse, new_lse)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    g = flashgrad.backward(q, k, v, out, lse, np.ones_like(out), dq=dq, dk=dk, dv=dv)
    assert g.dq is dq and g.dk is dk and g.dv is dv and g.dsinks is None and g.dbias is None


def test_float16_buffer_and_bfloat16_dlpack():
    q, k, v = data(np.float32)
    out16, _ = flashgrad.forward(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert out16.dtype == np.float16
    tq, tk, tv = (torch.from_numpy(x).bfloat16() for x in (q, k, v))
    outb, lseb = flashgrad.forward(tq, tk, tv)  # torch in, torch out
    assert isinstance(outb, torch.Tensor) and outb.dtype == torch.bfloat16 and lseb.dtype == torch.float32
    ref, _ = flashgrad.forward(q, k, v)
    assert np.abs(out16.astype(np.float32) - ref).max() < 1e-2
    assert (outb.float() - torch.from_numpy(ref)).abs().max() < 5e-2


def test_raw_dlpack_capsules():
    q, k, v = (torch.from_numpy(x) for x in data(np.float32))
    out = torch.empty(2, 9, 4, 6)
    lse = torch.empty(2, 4, 9)
    caps = [torch.utils.dlpack.to_dlpack(x) for x in (q, k, v, out, lse)]
    flashgrad.forward(*caps[:3], out=caps[3], lse=caps[4])
    ref, _ = flashgrad.forward(q, k, v)
    assert torch.equal(out, ref)


def test_requires_grad_tensors_are_read():
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in data())
    out, _ = flashgrad.forward(q, k, v)
    assert not out.requires_grad


def test_varlen_numpy():
    q, k, v = data()
    cu_q = np.array([0, 4, 9], np.int32)
    cu_k = np.array([0, 6, 13], np.int32)
    qp, kp, vp = q[0], k[0], v[0]  # (total, heads, dim)
    out, lse = flashgrad.forward(qp, kp, vp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert out.shape == (9, 4, 6) and lse.shape == (4, 9)
    first, _ = flashgrad.forward(q[:1, :4], k[:1, :6], v[:1, :6], causal=True)
    np.testing.assert_allclose(out[:4], first[0], atol=1e-13)


def test_workspace_and_info():
    q, k, v = data(np.float32)
    assert flashgrad.forward_workspace_bytes(q, k, v, causal=True) > 0
    assert flashgrad.backward_workspace_bytes(q, k, v) > 0
    with pytest.raises(TypeError, match="unexpected keyword"):
        flashgrad.forward_workspace_bytes(q, k, v, casual=True)
    assert flashgrad.isa() in ("amx", "avx512bf16", "avx512", "avx2", "scalar")
    assert flashgrad.max_threads() >= 1


def test_results_do_not_depend_on_threads():
    q, k, v = data(np.float32)
    a = flashgrad.forward(q, k, v, num_threads=1)
    b = flashgrad.forward(q, k, v, num_threads=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_tasks_on_torchs_openmp_threads_give_the_own_pools_bytes():
    import flashgrad.torch  # noqa: F401  (at import it hands the tasks to torch's OpenMP runtime)
    from flashgrad.torch._threads import torch_openmp_runtime

    library = torch_openmp_runtime(torch)
    if not library:
        pytest.skip("this torch loaded no libgomp or libiomp5")
    assert flashgrad.thread_runner() == f"openmp {library}"
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 300, 4, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 300, 2, 32)).astype(np.float32) for _ in range(2))
    dout = rng.standard_normal(q.shape).astype(np.float32)
    runs = []
    try:
        for runtime in (library, ""):
            flashgrad.use_openmp_runtime(runtime)
            out, lse = flashgrad.forward(q, k, v, causal=True, num_threads=2)
            runs.append((out, lse, *flashgrad.backward(q, k, v, out, lse, dout, causal=True, num_threads=2)[:3]))
        assert flashgrad.thread_runner() == "flashgrad"
    finally:
        flashgrad.use_openmp_runtime(library)
    assert all(np.array_equal(x, y) for x, y in zip(*runs))


def test_openmp_runtime_errors_name_the_library():
    with pytest.raises(ValueError, match=r"use_openmp_runtime: argument 'library'.*/nonexistent/libgomp"):
        flashgrad.use_openmp_runtime("/nonexistent/libgomp.so.1")


def test_torch_openmp_off_keeps_the_own_pool():
    import subprocess
    import sys

    code = "import flashgrad, flashgrad.torch; print(flashgrad.thread_runner())"
    env = dict(os.environ, FLASHGRAD_TORCH_OPENMP="0")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "flashgrad"
