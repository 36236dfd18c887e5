"""Zoo baseline: ResNet-20 (width 16) on Fashion-MNIST (Debian's dataset-fashion-mnist), with model EMA.

One run gives four zoo entries: the model, its EMA, and each after precise BN (basebn.tools.zoo_export).
Sized for a 2-core CPU: a few epochs; raise solver.max_epoch for more accuracy.
"""
from basebn.config import BaseConfig


class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            batch_size=128,
            data=dict(name="fashion_mnist", pad=2, hflip=True),
            model=dict(name="resnet20", base_width=16, stem_stride=2),
            solver=dict(basic_lr=0.1, max_epoch=3, warmup_epochs=0.5, weight_decay=5e-4, lr_schedule="cosine"),
            model_ema=dict(enabled=True, momentum=0.998, start_epoch=0),
            log_every_n_iter=50,
        ))
