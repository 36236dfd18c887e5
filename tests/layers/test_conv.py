"""The fast CPU conv (oneDNN ops, or the numpy weight gradient without them) against a numpy reference
written from the definition. tests/ops/test_conv_dnnl.py covers the oneDNN ops in depth."""
import numpy as np
import pytest

import megengine as mge
from megengine.autodiff import GradManager

from basebn.layers.conv import Conv2d, conv2d, conv_weight_grad


def reference_conv(x, w, stride, pad, dil, groups):
    """Direct definition: y[n,o,h,w] = sum_{c,i,j} x_pad[n, g*Cg+c, h*s+i*d, w*s+j*d] w[o,c,i,j]."""
    n, cin, hh, ww = x.shape
    cout, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (hh + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    wo = (ww + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, cout, ho, wo))
    og = cout // groups
    for o in range(cout):
        g = o // og
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dil: i * dil + stride * (ho - 1) + 1: stride,
                           j * dil: j * dil + stride * (wo - 1) + 1: stride]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
    return y


@pytest.mark.parametrize("n,cin,h,cout,k,stride,pad,dil,groups", [
    (2, 4, 7, 6, 3, 1, 1, 1, 1),
    (2, 4, 8, 6, 3, 2, 1, 1, 2),
    (1, 3, 9, 3, 3, 1, 2, 2, 3),
    (3, 2, 5, 4, 1, 1, 0, 1, 1),
    (2, 2, 6, 2, 3, 2, 0, 1, 1),
])
def test_conv2d_values_and_grads(n, cin, h, cout, k, stride, pad, dil, groups):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, cin, h, h)).astype(np.float32)
    w = rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
    y_ref = reference_conv(x.astype(np.float64), w.astype(np.float64), stride, pad, dil, groups)
    dy = rng.standard_normal(y_ref.shape)
    # loss = sum(y * dy): dW[o,c,i,j] = d/dw of the reference, by finite structure (linear in w)
    dw_ref = np.zeros_like(w, dtype=np.float64)
    for idx in np.ndindex(*w.shape):
        e = np.zeros_like(w, dtype=np.float64)
        e[idx] = 1
        dw_ref[idx] = (reference_conv(x.astype(np.float64), e, stride, pad, dil, groups) * dy).sum()
    wt = w.reshape(groups, cout // groups, cin // groups, k, k) if groups > 1 else w
    xt, wp = mge.tensor(x), mge.Parameter(wt)
    gm = GradManager().attach([wp])
    with gm:
        y = conv2d(xt, wp, None, stride, pad, dil, groups)
        gm.backward((y * mge.tensor(dy.astype(np.float32))).sum())
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wp.grad.numpy().reshape(w.shape), dw_ref, rtol=1e-4, atol=1e-4)


def test_module_matches_megengine_conv_and_input_grad():
    rng = np.random.default_rng(1)
    ours = Conv2d(3, 5, 3, stride=1, padding=1, bias=True)
    x = mge.tensor(rng.standard_normal((2, 3, 6, 6)).astype(np.float32))
    gm = GradManager().attach([x, ours.weight, ours.bias])
    with gm:
        y = ours(x)
        gm.backward((y ** 2).sum())
    y_ref = reference_conv(x.numpy().astype(np.float64), ours.weight.numpy().astype(np.float64), 1, 1, 1, 1)
    y_ref += ours.bias.numpy().reshape(1, -1, 1, 1)
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours.bias.grad.numpy().ravel(), (2 * y_ref).sum(axis=(0, 2, 3)), rtol=1e-4)
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("n,cin,h,cout,k,stride,pad,dil,groups", [
    (2, 8, 6, 8, 3, 1, 1, 1, 8),   # depthwise
    (2, 4, 7, 8, 3, 2, 1, 1, 4),   # depthwise, channel multiplier 2
    (1, 6, 9, 4, 3, 1, 2, 2, 2),   # grouped, dilated
])
def test_numpy_weight_grad_grouped(n, cin, h, cout, k, stride, pad, dil, groups):
    """The fallback's conv_weight_grad (one batched matmul over the groups per tap) in MegEngine's grouped layout."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, cin, h, h))
    w_shape = (cout, cin // groups, k, k)
    y_shape = reference_conv(x, np.zeros(w_shape), stride, pad, dil, groups).shape
    dy = rng.standard_normal(y_shape)
    dw_ref = np.zeros(w_shape)
    for idx in np.ndindex(*w_shape):  # loss = sum(y * dy) is linear in w
        e = np.zeros(w_shape)
        e[idx] = 1
        dw_ref[idx] = (reference_conv(x, e, stride, pad, dil, groups) * dy).sum()
    grouped = (groups, cout // groups, cin // groups, k, k)
    got = conv_weight_grad(x.astype(np.float32), dy.astype(np.float32), grouped, stride, pad, dil, groups)
    assert got.shape == grouped and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(w_shape), dw_ref, rtol=1e-4, atol=1e-4)
