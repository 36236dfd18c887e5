"""Zoo second family: MobileNetV2 x0.5 on Fashion-MNIST upsampled to 56 px (Debian's dataset-fashion-mnist).

MobileNetV2's stem and stages stride by 32 in all; at 56 px its last stages still see 2x2 maps (at 28 px, 1x1).
The recipe is configs/fmnist_resnet20.py's (SGD 0.1, cosine, weight decay 5e-4, EMA), run longer.

    python -m basebn.train configs/fmnist_mbnetv2.py
"""
from basebn.config import BaseConfig


class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            batch_size=128,
            data=dict(name="fashion_mnist", image_size=56, pad=4, hflip=True),
            model=dict(name="mbnetv2_x050"),
            solver=dict(basic_lr=0.1, max_epoch=18, warmup_epochs=0.5, weight_decay=5e-4, lr_schedule="cosine"),
            model_ema=dict(enabled=True, momentum=0.998, start_epoch=0),
            eval_every_n_epoch=6,
            log_every_n_iter=50,
        ))
