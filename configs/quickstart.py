"""Quickstart: ResNet-20 (width 8) on the embedded synthetic dataset; trains and evaluates in minutes on 2 CPU cores."""
from basebn.config import BaseConfig


class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            batch_size=64,
            data=dict(name="synthetic", image_size=16, train_size=4000, test_size=1000, pad=2, hflip=False),
            model=dict(name="resnet20", base_width=8),
            solver=dict(basic_lr=0.1, max_epoch=4, warmup_epochs=1, weight_decay=5e-4),
            log_every_n_iter=20,
        ))
