"""A float64 numpy transcription of a CIFAR-style ResNet (basebn's resnet20/32/56) in eval mode: forward and
input gradient, written from the math (conv, BN with running statistics, ReLU, residual add, global average
pool, linear), with no MegEngine code. It also returns how close any ReLU input came to 0: the input gradient
of a ReLU network is discontinuous there, so a float32 check of x.grad is only well posed away from it."""
import numpy as np

__all__ = ["resnet_eval_forward_backward"]


def _conv(x, w, stride, pad):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    taps = [(i, j) for i in range(kh) for j in range(kw)]
    cols = np.stack([xp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride] for i, j in taps], 2)
    wk = w.reshape(o, c, kh * kw)
    y = np.einsum("nckhw,ock->nohw", cols, wk)

    def back(dy):
        dcols = np.einsum("nohw,ock->nckhw", dy, wk)
        dxp = np.zeros_like(xp)
        for k, (i, j) in enumerate(taps):
            dxp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride] += dcols[:, :, k]
        return dxp[:, :, pad:pad + h, pad:pad + wd]
    return y, back


def resnet_eval_forward_backward(state, x, dy_out, depth_per_stage=3, eps=1e-5):
    """(y, dx, smallest |ReLU input|) of loss = sum(y * dy_out) for a basebn CIFAR ResNet state dict in eval mode."""
    W = {k: np.asarray(v, np.float64) for k, v in state.items()}
    kinks, backs = [], []

    def bn(t, pre):
        s = W[pre + ".weight"].reshape(1, -1, 1, 1) / np.sqrt(W[pre + ".running_var"].reshape(1, -1, 1, 1) + eps)
        return (t - W[pre + ".running_mean"].reshape(1, -1, 1, 1)) * s + W[pre + ".bias"].reshape(1, -1, 1, 1), s

    def conv_bn(t, conv, norm, stride, pad):
        y, back = _conv(t, W[conv + ".weight"], stride, pad)
        y, s = bn(y, norm)
        return y, lambda d: back(d * s)

    def relu(t):
        kinks.append(np.abs(t).min())
        mask = t > 0
        return t * mask, lambda d: d * mask

    def chain(t, *steps):
        saved = []
        for step in steps:
            t, b = step(t)
            saved.append(b)

        def back(d):
            for b in reversed(saved):
                d = b(d)
            return d
        return t, back

    t, b = chain(np.asarray(x, np.float64), lambda t: conv_bn(t, "conv1", "bn1", 1, 1), relu)
    backs.append(b)
    for i in range(3):
        for j in range(depth_per_stage):
            pre, stride = f"layer{i + 1}.{j}", 2 if (i > 0 and j == 0) else 1
            main, b_main = chain(t, lambda u: conv_bn(u, pre + ".conv1", pre + ".bn1", stride, 1), relu,
                                 lambda u: conv_bn(u, pre + ".conv2", pre + ".bn2", 1, 1))
            if pre + ".downsample.0.weight" in W:
                short, b_short = conv_bn(t, pre + ".downsample.0", pre + ".downsample.1", stride, 0)
            else:
                short, b_short = t, (lambda d: d)
            t, b_relu = relu(main + short)
            backs.append(lambda d, b_main=b_main, b_short=b_short, b_relu=b_relu: b_main(b_relu(d)) + b_short(b_relu(d)))
    hw = t.shape[2] * t.shape[3]
    y = t.mean(axis=(2, 3)) @ W["fc.weight"].T + W["fc.bias"]
    d = np.broadcast_to((np.asarray(dy_out, np.float64) @ W["fc.weight"])[:, :, None, None] / hw, t.shape)
    for b in reversed(backs):
        d = b(d)
    return y, d, min(kinks)
