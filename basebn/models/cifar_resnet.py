"""More CIFAR-style ResNets (He et al. 2016 sec. 4.2) on basebn's :class:`~basebn.models.resnet.ResNet`:
resnet44 and resnet110, with the same kwargs and key names as resnet20/32/56."""
from .resnet import cifar_resnet

__all__ = ["cifar_resnet", "resnet44", "resnet110"]


def resnet44(**kw):
    """ResNet-44 for 32 px inputs (7 blocks per stage)."""
    return cifar_resnet(44, **kw)


def resnet110(**kw):
    """ResNet-110 for 32 px inputs (18 blocks per stage)."""
    return cifar_resnet(110, **kw)
