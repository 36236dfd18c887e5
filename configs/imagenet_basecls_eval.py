"""Evaluate basecls's published ImageNet weights with basecls's eval transform (basecls commit 2f206e9's base_cfg).

    python -m basebn.test configs/imagenet_basecls_eval.py -w basecls:resnet18 data.root=/path/to/imagenet
    python -m basebn.test configs/imagenet_basecls_eval.py -w basecls:effnet_b1 model.name=effnet_b1 \
        data.image_size=240 data.root=/path/to/imagenet

(root/val/CLASS/*.JPEG; -w basecls:NAME needs model.name=NAME.) basecls's test transform: resize the shorter
side to img_size / crop_pct (crop_pct 0.875: 256 for 224), bilinear, then center crop img_size; mean
(103.530, 116.280, 123.675) and std (57.375, 57.12, 58.395) on its BGR images, i.e. the values below on
basebn's RGB images (basecls:NAME reverses the first conv's input channels to match; see README 'Weights
from basecls and timm').
"""
from basebn.config import BaseConfig


class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            batch_size=64,
            num_classes=1000,
            data=dict(name="imagefolder", root=None, image_size=224, crop_pct=0.875, interpolation="bilinear",
                      mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375)),
            model=dict(name="resnet18"),
        ))
