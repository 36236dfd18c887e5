"""The standard ResNet-50 ImageNet recipe (Goyal et al. 2017 / torchvision / basecls) on any ImageFolder.

Run: python -m basebn.train configs/imagenet_resnet50.py data.root=/path/to/imagenet  (root/train/CLASS/*.JPEG,
root/val/CLASS/*.JPEG). 100 epochs of SGD (momentum 0.9, weight decay 1e-4), lr 0.1 x total batch / 256 with
5 linear warm-up epochs then cosine (solver.lr_schedule="step" with lr_decay_steps=(30, 60, 90) for the 90-epoch
step variant), label smoothing 0.1, RandomResizedCrop 224 + flip, eval resize 256 -> center crop 224
(crop_pct 0.875). batch_size is per process and basic_lr per process (the total lr is basic_lr x processes), so
0.1 x 64 / 256 keeps lr = 0.1 x total batch / 256 for any number of GPUs. Decoding runs in data.num_workers
processes (default: the CPUs available, at most 8); python -m basebn.tools.data_speed checks they keep up.
"""
from basebn.config import BaseConfig

PER_PROCESS_BATCH = 64


class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(
            batch_size=PER_PROCESS_BATCH,
            num_classes=1000,
            data=dict(name="imagefolder", root=None, image_size=224, train_crop="random_resized",
                      rrc_scale=(0.08, 1.0), rrc_ratio=(3 / 4, 4 / 3), hflip=True, crop_pct=0.875,
                      interpolation="bilinear"),
            model=dict(name="resnet50", stem="imagenet", zero_init_residual=True),
            loss=dict(label_smooth=0.1),
            solver=dict(optimizer="sgd", basic_lr=0.1 * PER_PROCESS_BATCH / 256, momentum=0.9, nesterov=False,
                        weight_decay=1e-4, max_epoch=100, warmup_epochs=5, warmup_factor=0.1,
                        lr_schedule="cosine", lr_decay_steps=(30, 60, 90), lr_decay_factor=0.1),
            log_every_n_iter=100,
        ))
