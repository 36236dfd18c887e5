"""Fine-tune a Fashion-MNIST zoo model with frozen BN statistics (bn.norm_eval) and efficient conv-BN.

    python -m basebn.train configs/fmnist_finetune.py                       # from zoo:fmnist_r20
    python -m basebn.train configs/fmnist_finetune.py model.weights=runs/x  # from your own run

Same data and model as configs/fmnist_resnet20.py (it derives from it). With norm_eval every BN
layer keeps its running statistics (eval mode) while the conv and BN weights still learn;
efficient conv-BN folds each BN into its conv on the fly, so no conv output is kept alive for
backward (less activation memory).
"""
from basebn.config import config_class

Base = config_class("fmnist_resnet20.py", relative_to=__file__)


class Cfg(Base):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            model=dict(weights="zoo:fmnist_r20"),
            solver=dict(basic_lr=0.01, max_epoch=1, warmup_epochs=0),
            model_ema=dict(enabled=False),
            bn=dict(norm_eval=True, efficient_conv_bn_eval=True),
        ))
