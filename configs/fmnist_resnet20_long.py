"""The zoo's longest run: configs/fmnist_resnet20.py for 8 epochs with an EMA window sized for it.

    python -m basebn.train configs/fmnist_resnet20_long.py      # ~1 h on a 2-core CPU
"""
from basebn.config import config_class

Base = config_class("fmnist_resnet20.py", relative_to=__file__)


class Cfg(Base):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            solver=dict(max_epoch=8),
            model_ema=dict(momentum=0.995),  # a window of ~200 iterations, about half an epoch
        ))
