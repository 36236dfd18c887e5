"""More CIFAR-style ResNets (He et al. 2016 sec. 4.2) on basebn's :class:`~basebn.models.resnet.ResNet`:
resnet44 and resnet110, with the same kwargs and key names as resnet20/32/56."""
from .resnet import BasicBlock, ResNet

__all__ = ["cifar_resnet", "resnet44", "resnet110"]


def cifar_resnet(depth, base_width=16, bn_momentum=None, bn_eps=None, **kw):
    """ResNet-`depth` (6n + 2) with three stages of n basic blocks, `base_width` x (1, 2, 4) wide.

    None for bn_momentum / bn_eps keeps ResNet's defaults (0.9, 1e-5).
    """
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n + 2, got {depth}")
    n = (depth - 2) // 6
    kw.update({k: v for k, v in (("bn_momentum", bn_momentum), ("bn_eps", bn_eps)) if v is not None})
    return ResNet(BasicBlock, [n, n, n], [base_width, base_width * 2, base_width * 4], **kw)


def resnet44(**kw):
    """ResNet-44 for 32 px inputs (7 blocks per stage)."""
    return cifar_resnet(44, **kw)


def resnet110(**kw):
    """ResNet-110 for 32 px inputs (18 blocks per stage)."""
    return cifar_resnet(110, **kw)
