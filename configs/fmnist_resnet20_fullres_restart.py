"""A second cosine cycle (a warm restart) for the full-resolution model: 6 more epochs from zoo:fmnist_r20_fullres.

The 7-epoch run (configs/fmnist_resnet20_fullres.py, 92.53%) still underfits; one longer schedule does not fit a
3-hour working session on 2 cores, a restart from its weights does (SGDR-style, lower peak LR).

    python -m basebn.train configs/fmnist_resnet20_fullres_restart.py     # ~2 h on a 2-core CPU (93.20%)
    # a third cycle from the second's exported weights (zoo:fmnist_r20_fullres_restart2, 93.63%)
    python -m basebn.train configs/fmnist_resnet20_fullres_restart.py model.weights=zoo:fmnist_r20_fullres_restart
"""
from basebn.config import config_class

Base = config_class("fmnist_resnet20_fullres.py", relative_to=__file__)


class Cfg(Base):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            model=dict(weights="zoo:fmnist_r20_fullres"),
            solver=dict(basic_lr=0.05, max_epoch=6, warmup_epochs=0.25),
        ))
