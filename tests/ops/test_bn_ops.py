"""basebn.ops.bn_ops against a float64 numpy reference written from the math.

Every numerical test runs on both paths: the compiled kernels ("kernel", skipped with the build
error as reason when they cannot be built) and the pure-MegEngine fallback.
"""
import os

import numpy as np
import pytest
from loguru import logger

import megengine as mge
import megengine.functional as F

import basebn
from basebn.ops import bn_ops, kernel_build, kernel_library
from tests.support.bn_ops import failed_kernel_build, forced_strided_kernels


# ----------------------------------------------------------------------------- references
def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bs(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def ref_stats(x):
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return np.zeros(x.shape[1]), np.zeros(x.shape[1])
    mean = x.mean(axis=_axes(x))
    m2 = ((x - mean.reshape(_bs(x))) ** 2).sum(axis=_axes(x))
    return mean, m2


def ref_normalize(x, mean, invstd, w=None, b=None):
    x = np.asarray(x, np.float64)
    c = x.shape[1]
    w = np.ones(c) if w is None else np.asarray(w, np.float64)
    b = np.zeros(c) if b is None else np.asarray(b, np.float64)
    bs = _bs(x)
    return (x - mean.reshape(bs)) * (invstd * w).reshape(bs) + b.reshape(bs)


def ref_backward_reduce(dy, x, mean, invstd):
    dy, x = np.asarray(dy, np.float64), np.asarray(x, np.float64)
    xhat = (x - np.asarray(mean, np.float64).reshape(_bs(x))) * np.asarray(invstd, np.float64).reshape(_bs(x))
    return dy.sum(axis=_axes(x)), (dy * xhat).sum(axis=_axes(x))


def ref_backward_elemt(dy, x, mean, invstd, w, sum_dy, sum_dy_xhat, count):
    dy, x = np.asarray(dy, np.float64), np.asarray(x, np.float64)
    bs = _bs(x)
    c = x.shape[1]
    w = np.ones(c) if w is None else np.asarray(w, np.float64)
    mean, invstd = np.asarray(mean, np.float64), np.asarray(invstd, np.float64)
    xhat = (x - mean.reshape(bs)) * invstd.reshape(bs)
    sum_dy = np.asarray(sum_dy, np.float64).reshape(bs)
    sum_dy_xhat = np.asarray(sum_dy_xhat, np.float64).reshape(bs)
    return (w * invstd).reshape(bs) * (dy - sum_dy / count - xhat * sum_dy_xhat / count)


def _close(got, want, rtol=1e-5, atol=1e-5, what=""):
    got = got.numpy() if isinstance(got, mge.Tensor) else np.asarray(got)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol, err_msg=what)


def _full_check(x_np, rng, backend, tol=1e-5, out_tol=1e-5, x_t=None, count_scale=1):
    """Run all four ops on x_np (or the given tensor x_t) and compare with the reference."""
    c = x_np.shape[1]
    x = mge.tensor(x_np) if x_t is None else x_t
    dy_np = rng.standard_normal(x_np.shape).astype(x_np.dtype)
    dy = mge.tensor(dy_np)
    w = rng.uniform(0.5, 1.5, c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)

    mean, m2 = bn_ops.bn_stats(x)
    assert mean.dtype == np.float32 and m2.dtype == np.float32
    assert tuple(mean.shape) == (c,) and tuple(m2.shape) == (c,)
    rmean, rm2 = ref_stats(x_np)
    scale = max(1.0, float(np.abs(x_np.astype(np.float64)).max())) if x_np.size else 1.0
    _close(mean, rmean, rtol=tol, atol=tol * scale, what="mean")
    cnt = max(1, x_np.size // c)
    _close(m2, rm2, rtol=max(10 * tol, 1e-4), atol=1e-5 * max(1.0, float(rm2.max(initial=0))), what="m2")

    var = m2.numpy().astype(np.float64) / cnt
    invstd = (1.0 / np.sqrt(var + 1e-5)).astype(np.float32)
    mean_np = mean.numpy()
    for ww, bb in ((None, None), (w, b)):
        y = bn_ops.bn_normalize(x, mean, mge.tensor(invstd), None if ww is None else mge.tensor(ww), None if bb is None else mge.tensor(bb))
        assert y.dtype == x.dtype and tuple(y.shape) == x_np.shape
        _close(y, ref_normalize(x_np, mean_np.astype(np.float64), invstd.astype(np.float64), ww, bb), rtol=out_tol, atol=out_tol, what="y")

    sd, sdx = bn_ops.bn_backward_reduce(dy, x, mean, mge.tensor(invstd))
    assert sd.dtype == np.float32 and tuple(sd.shape) == (c,)
    rsd, rsdx = ref_backward_reduce(dy_np, x_np, mean_np, invstd)
    red_tol = tol * max(1.0, np.sqrt(cnt))
    _close(sd, rsd, rtol=1e-4, atol=red_tol, what="sum_dy")
    _close(sdx, rsdx, rtol=1e-4, atol=red_tol, what="sum_dy_xhat")

    count = cnt * count_scale
    for ww in (None, w):
        dx = bn_ops.bn_backward_elemt(dy, x, mean, mge.tensor(invstd), None if ww is None else mge.tensor(ww), sd, sdx, count)
        assert dx.dtype == dy.dtype and tuple(dx.shape) == x_np.shape
        want = ref_backward_elemt(dy_np, x_np, mean_np, invstd, ww, sd.numpy(), sdx.numpy(), count)
        _close(dx, want, rtol=out_tol, atol=out_tol * max(1.0, float(np.abs(want).max(initial=0))), what="dx")


SHAPES = [
    (8, 3),  # 2D: (N, C)
    (4, 3, 7),  # 3D, small S: columns path
    (2, 3, 5, 6),  # 4D, S = 30
    (2, 3, 2, 3, 4),  # 5D
    (1, 4, 5, 5),  # N = 1
    (3, 1, 6, 6),  # C = 1
    (2, 3, 9, 10),  # S = 90: rows path
    (1, 2, 70, 70),  # S = 4900 > one 4096 chunk: chunk merge
    (20, 960, 4, 4),  # columns path, C * S = 15 360 columns: blocks of 8, 8 and 4 rows merged per column
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_all_ops_float32(backend, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    _full_check(x, rng, backend)


def test_global_count_exceeds_local(backend):
    """SyncBN passes all-reduced sums and the global count (here 3x the local one)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 4, 4)).astype(np.float32)
    _full_check(x, rng, backend, count_scale=3)


def test_n_zero(backend):
    x = mge.tensor(np.zeros((0, 3, 4, 4), np.float32))
    mean, m2 = bn_ops.bn_stats(x)
    np.testing.assert_array_equal(mean.numpy(), np.zeros(3, np.float32))
    np.testing.assert_array_equal(m2.numpy(), np.zeros(3, np.float32))
    ones = mge.tensor(np.ones(3, np.float32))
    y = bn_ops.bn_normalize(x, mean, ones, ones, ones)
    assert tuple(y.shape) == (0, 3, 4, 4)
    sd, sdx = bn_ops.bn_backward_reduce(x, x, mean, ones)
    np.testing.assert_array_equal(sd.numpy(), np.zeros(3, np.float32))
    np.testing.assert_array_equal(sdx.numpy(), np.zeros(3, np.float32))
    dx = bn_ops.bn_backward_elemt(x, x, mean, ones, None, ones, ones, 10)
    assert tuple(dx.shape) == (0, 3, 4, 4)


def test_all_constant_np_ones(backend):
    """A fresh all-ones tensor straight from numpy (this once read as zeros in a kernel)."""
    shape = (4, 3, 5, 5)
    x = mge.tensor(np.ones(shape, np.float32))
    mean, m2 = bn_ops.bn_stats(x)
    np.testing.assert_array_equal(mean.numpy(), np.ones(3, np.float32))
    np.testing.assert_array_equal(m2.numpy(), np.zeros(3, np.float32))
    rng = np.random.default_rng(2)
    _full_check(np.ones(shape, np.float32), rng, backend, x_t=mge.tensor(np.ones(shape, np.float32)))


def test_all_constant_broadcast(backend):
    per_c = np.array([2.5, -1.0, 7.0], np.float32)
    x = F.broadcast_to(mge.tensor(per_c.reshape(1, 3, 1, 1)), (4, 3, 6, 6))
    x_np = np.broadcast_to(per_c.reshape(1, 3, 1, 1), (4, 3, 6, 6)).copy()
    mean, m2 = bn_ops.bn_stats(x)
    np.testing.assert_array_equal(mean.numpy(), per_c)
    np.testing.assert_array_equal(m2.numpy(), np.zeros(3, np.float32))
    _full_check(x_np, np.random.default_rng(3), backend, x_t=x)
    x2 = F.broadcast_to(mge.tensor(np.float32(4.0)), (2, 3, 4))  # scalar broadcast, 3D
    mean, m2 = bn_ops.bn_stats(x2)
    np.testing.assert_array_equal(mean.numpy(), np.full(3, 4.0, np.float32))
    np.testing.assert_array_equal(m2.numpy(), np.zeros(3, np.float32))


def test_fresh_input_from_preceding_ops(backend):
    """Inputs produced by still-queued MegEngine ops must be waited for."""
    rng = np.random.default_rng(4)
    base = mge.tensor(rng.standard_normal((16, 8, 32, 32)).astype(np.float32))
    base.numpy()
    x = F.exp(base * 0.5) * 3 + 1  # async producer
    mean, m2 = bn_ops.bn_stats(x)
    rmean, rm2 = ref_stats(x.numpy())
    _close(mean, rmean, rtol=1e-5, atol=1e-5)
    _close(m2, rm2, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("force_strided", [False, True], ids=["as_given", "gather_path"])
def test_non_contiguous(backend, force_strided):
    with forced_strided_kernels(force_strided):
        rng = np.random.default_rng(5)
        base = rng.standard_normal((3, 4, 6, 10)).astype(np.float32)
        # transposed (C, N, H, W) -> (N, C, H, W) view and a strided slice
        xt = mge.tensor(np.ascontiguousarray(base.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
        _full_check(base, rng, backend, x_t=xt)
        xs = mge.tensor(base)[:, :, ::2, 1::3]
        _full_check(np.ascontiguousarray(base[:, :, ::2, 1::3]), rng, backend, x_t=xs)
        small = rng.standard_normal((5, 6, 3)).astype(np.float32)  # columns path
        _full_check(small, rng, backend, x_t=mge.tensor(small))


@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5, 6), (2, 2, 3, 4, 5)], ids=lambda s: "x".join(map(str, s)))
def test_float16(backend, shape):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float16)
    # stats accumulate in float32 from the exact fp16 values: tight; fp16 outputs: fp16 tolerance
    _full_check(x, rng, backend, tol=1e-5, out_tol=1e-2)


def test_mixed_dtypes(backend):
    rng = np.random.default_rng(7)
    x_np = rng.standard_normal((4, 3, 5)).astype(np.float16)
    dy_np = rng.standard_normal((4, 3, 5)).astype(np.float32)
    x, dy = mge.tensor(x_np), mge.tensor(dy_np)
    mean, m2 = bn_ops.bn_stats(x)
    invstd = mge.tensor((1 / np.sqrt(m2.numpy() / 20 + 1e-5)).astype(np.float32))
    sd, sdx = bn_ops.bn_backward_reduce(dy, x, mean, invstd)
    rsd, rsdx = ref_backward_reduce(dy_np, x_np, mean.numpy(), invstd.numpy())
    _close(sd, rsd, rtol=1e-4, atol=1e-4)
    _close(sdx, rsdx, rtol=1e-4, atol=1e-4)
    dx = bn_ops.bn_backward_elemt(dy, x, mean, invstd, None, sd, sdx, 20)
    assert dx.dtype == np.float32
    want = ref_backward_elemt(dy_np, x_np, mean.numpy(), invstd.numpy(), None, sd.numpy(), sdx.numpy(), 20)
    _close(dx, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(16, 3, 16, 16), (4096, 3), (20, 960, 4, 4)], ids=["4D", "2D", "wide-columns"])
def test_large_mean_offset(backend, shape):
    """1e4 + noise(std 0.1): naive float32 E[x^2] - E[x]^2 is garbage, the stable path is not."""
    rng = np.random.default_rng(8)
    x = (1e4 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    rmean, rm2 = ref_stats(x)
    mean, m2 = bn_ops.bn_stats(mge.tensor(x))
    rel = np.abs(m2.numpy() / rm2 - 1).max()
    assert rel < 1e-3, rel
    np.testing.assert_allclose(mean.numpy(), rmean, rtol=1e-6)
    # the same data through naive float32 E[x^2] - E[x]^2: shows the test has teeth
    cnt = x.size // x.shape[1]
    xf = x.reshape(x.shape[0], x.shape[1], -1)
    naive = (xf * xf).sum(axis=(0, 2), dtype=np.float32) / np.float32(cnt) - xf.mean(axis=(0, 2), dtype=np.float32) ** 2
    assert np.abs(naive * cnt / rm2 - 1).max() > 0.1
    # normalize keeps precision too: subtract the mean before scaling
    invstd = (1 / np.sqrt(rm2 / cnt + 1e-5)).astype(np.float32)
    y = bn_ops.bn_normalize(mge.tensor(x), mean, mge.tensor(invstd))
    _close(y, ref_normalize(x, mean.numpy().astype(np.float64), invstd.astype(np.float64)), rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("shape", [(16, 16, 64, 64), (65536, 16), (16384, 8, 8)], ids=["rows", "cols2D", "cols3D"])
def test_multithreaded(backend, shape, monkeypatch):
    """Several threads (forced to 4; every shape is far above 4 x the per-thread minimum) match the reference."""
    monkeypatch.setenv("BASEBN_NUM_THREADS", "4")
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(shape) + 5).astype(np.float32)
    _full_check(x, rng, backend, tol=2e-5, out_tol=2e-5)


def test_row_path_does_not_depend_on_thread_count(monkeypatch):
    """The (N, C, S >= 32) kernels sum each row, then a channel's rows in n order: the statistics and the backward
    sums are bitwise the same at 1, 2 and 3 threads (the split over OpenMP's pool must not leak into results)."""
    if not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    rng = np.random.default_rng(12)
    x = mge.tensor((rng.standard_normal((24, 8, 48, 48)) * 3 + 2).astype(np.float32))
    dy = mge.tensor(rng.standard_normal((24, 8, 48, 48)).astype(np.float32))
    outs = []
    with bn_ops.use_backend("kernel"):
        for threads in ("1", "2", "3"):
            monkeypatch.setenv("BASEBN_NUM_THREADS", threads)
            mean, m2 = bn_ops.bn_stats(x)
            invstd = (m2 / float(24 * 48 * 48) + 1e-5) ** -0.5
            s1, s2 = bn_ops.bn_backward_reduce(dy, x, mean, invstd)
            dx = bn_ops.bn_backward_elemt(dy, x, mean, invstd, None, s1, s2, 24 * 48 * 48)
            outs.append([t.numpy() for t in (mean, m2, s1, s2, dx)])
    for other in outs[1:]:
        for a, o in zip(outs[0], other):
            np.testing.assert_array_equal(a, o)


@pytest.mark.parametrize("symbolic", [False, True], ids=["trace", "trace_symbolic"])
def test_under_jit_trace(backend, symbolic):
    from megengine import jit

    rng = np.random.default_rng(10)
    x_np = (rng.standard_normal((4, 3, 5, 5)) + 2).astype(np.float32)
    dy_np = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    cnt = 100

    @jit.trace(symbolic=symbolic)
    def step(x, dy):
        mean, m2 = bn_ops.bn_stats(F.exp(x))  # input made by a traced op
        invstd = 1.0 / F.sqrt(m2 / cnt + 1e-5)
        y = bn_ops.bn_normalize(F.exp(x), mean, invstd)
        s1, s2 = bn_ops.bn_backward_reduce(dy, F.exp(x), mean, invstd)
        dx = bn_ops.bn_backward_elemt(dy, F.exp(x), mean, invstd, None, s1, s2, cnt)
        return mean, y, dx

    e = np.exp(x_np.astype(np.float64))
    rmean, rm2 = ref_stats(e)
    rinv = 1 / np.sqrt(rm2 / cnt + 1e-5)
    rs1, rs2 = ref_backward_reduce(dy_np, e, rmean, rinv)
    for _ in range(3):  # recording run, then compiled runs
        mean, y, dx = step(mge.tensor(x_np), mge.tensor(dy_np))
        _close(mean, rmean, rtol=1e-5, atol=1e-5)
        _close(y, ref_normalize(e, rmean, rinv), rtol=1e-4, atol=1e-4)
        _close(dx, ref_backward_elemt(dy_np, e, rmean, rinv, None, rs1, rs2, cnt), rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------- selection
def test_backend_env_var(monkeypatch):
    monkeypatch.setenv("BASEBN_BN_BACKEND", "fallback")
    assert bn_ops.backend() == "fallback"
    monkeypatch.setenv("BASEBN_BN_BACKEND", "bogus")
    with pytest.raises(ValueError):
        bn_ops.backend()
    monkeypatch.setenv("BASEBN_BN_BACKEND", "auto")
    assert bn_ops.backend() == ("kernel" if kernel_library.kernel_available() else "fallback")
    with bn_ops.use_backend("fallback"):  # the context manager wins over the environment
        monkeypatch.setenv("BASEBN_BN_BACKEND", "kernel")
        assert bn_ops.backend() == "fallback"


def test_forced_kernel_build_failure_raises_and_auto_warns_once():
    messages = []
    with failed_kernel_build("RuntimeError: simulated compile error"):
        assert not kernel_library.kernel_available() and "simulated" in kernel_library.kernel_error()
        with bn_ops.use_backend("kernel"):
            with pytest.raises(kernel_library.KernelUnavailableError, match="simulated compile error"):
                bn_ops.backend()
        sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
        try:
            with bn_ops.use_backend("auto"):
                assert bn_ops.backend() == "fallback"
                x = mge.tensor(np.ones((2, 3), np.float32))
                mean, _ = bn_ops.bn_stats(x)
                np.testing.assert_array_equal(mean.numpy(), np.ones(3, np.float32))
        finally:
            logger.remove(sink)
    assert sum("simulated compile error" in m for m in messages) == 1


def test_kernel_cache_is_keyed_by_source_hash():
    if not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    library = kernel_library.kernel_library()
    path = library["path"]
    assert path.startswith(kernel_build.kernel_cache_root())
    spec = kernel_build.kernel_build_spec(library["cuda"])
    assert path.startswith(spec.build_dir)
    # the sources live inside the installed package, and the key changes with them
    assert all(p.startswith(kernel_build.kernel_source_dir()) for p in spec.sources + spec.headers)
    assert kernel_build.kernel_source_dir() == os.path.join(os.path.dirname(os.path.abspath(basebn.__file__)), "ops", "csrc")


CPUINFO = "processor\t: {n}\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse sse2 avx {extra}fma\n\n"


@pytest.mark.parametrize("extra, expected", [("avx2 ", ("-mavx2", "-ffp-contract=off")), ("", ())])
def test_library_is_built_for_avx2_only_where_the_cpu_lists_it(tmp_path, monkeypatch, extra, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO.format(n=0, extra=extra) + CPUINFO.format(n=1, extra=extra))
    monkeypatch.setattr(kernel_build.platform, "machine", lambda: "x86_64")
    assert kernel_build.cpu_vector_cflags(str(cpuinfo)) == expected
    monkeypatch.setattr(kernel_build.platform, "machine", lambda: "aarch64")  # no x86 flags on another ISA
    assert kernel_build.cpu_vector_cflags(str(cpuinfo)) == ()
    monkeypatch.setattr(kernel_build.platform, "machine", lambda: "x86_64")
    assert kernel_build.cpu_vector_cflags(str(tmp_path / "missing")) == ()  # no /proc: the portable build
    monkeypatch.setenv("BASEBN_KERNEL_PORTABLE", "1")  # the user's way back to the portable build
    assert kernel_build.cpu_vector_cflags(str(cpuinfo)) == ()


def test_build_key_follows_the_cpu_flags(monkeypatch):
    """The AVX2 build and the portable one get different cache directories, so a cache shared by machines of both
    kinds never hands the AVX2 library to a CPU without it."""
    here = kernel_build.kernel_build_spec(False, onednn=None)
    monkeypatch.setattr(kernel_build, "cpu_vector_cflags", lambda: ())
    portable = kernel_build.kernel_build_spec(False, onednn=None)
    monkeypatch.setattr(kernel_build, "cpu_vector_cflags", lambda: ("-mavx2", "-ffp-contract=off"))
    avx2 = kernel_build.kernel_build_spec(False, onednn=None)
    assert "-mavx2" not in portable.cflags and "-mavx2" in avx2.cflags
    assert portable.build_dir != avx2.build_dir
    assert here.build_dir in (portable.build_dir, avx2.build_dir)  # this machine's is one of the two
