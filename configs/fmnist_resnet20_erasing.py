"""ResNet-20 on Fashion-MNIST with random erasing (Zhong et al. 2017, "Random Erasing Data Augmentation").

The paper's Fashion-MNIST setting: erase one rectangle with probability p=0.5, area 2%-40% of the image
(s_l=0.02, s_h=0.4), aspect ratio r_1=0.3 (up to 1/0.3), each pixel filled with random noise, on top of the usual
pad-crop and flip. The rest is the zoo baseline's recipe (configs/fmnist_resnet20.py), run longer since
erasing is a regulariser that pays off with more epochs.
"""
from basebn.config import BaseConfig


class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            batch_size=128,
            data=dict(name="fashion_mnist", pad=2, hflip=True,
                      random_erasing=dict(prob=0.5, area=(0.02, 0.4), aspect=0.3, mode="pixel", count=1)),
            model=dict(name="resnet20", base_width=16, stem_stride=2),
            solver=dict(basic_lr=0.1, max_epoch=10, warmup_epochs=0.5, weight_decay=5e-4, lr_schedule="cosine"),
            model_ema=dict(enabled=True, momentum=0.998, start_epoch=0),
            log_every_n_iter=50,
        ))
