"""The default config schema. Every key a run may set is here, with what it means.

Experiment files in configs/ derive from BaseConfig; command-line KEY=VALUE pairs override it.
Names follow basecls where it has them.
"""
from basecore.config import ConfigDict

__all__ = ["BaseConfig", "DEFAULTS"]

DEFAULTS = dict(
    # mini-batch size per process (the total batch is batch_size * world_size)
    batch_size=128,
    num_classes=10,
    # run directory; None means runs/<config file name>
    output_dir=None,
    seed=42,
    data=dict(
        # one of: synthetic (embedded, no files needed), fashion_mnist, mnist, cifar10, cifar100, imagefolder
        name="synthetic",
        # dataset directory; None = the dataset's default (fashion_mnist: Debian's dataset-fashion-mnist)
        root=None,
        # resize images to this square size (imagefolder) / generated size (synthetic); None = native
        image_size=None,
        # None = the dataset's own channel count
        channels=None,
        # random-crop zero padding in pixels (0 disables random crop); None = the dataset's default
        pad=None,
        # random horizontal flips; None = the dataset's default (off for MNIST digits)
        hflip=None,
        # per-channel normalisation in 0-255 units; None = the dataset's defaults
        mean=None,
        std=None,
        # synthetic dataset sizes
        train_size=6000,
        test_size=1000,
        # use only the first N samples (of a fixed permutation); None = all
        max_train_samples=None,
        max_test_samples=None,
        # load the next batch in a background thread
        prefetch=True,
    ),
    model=dict(
        # any name of basebn.models.list_models() (basecls's names; python -m basebn.tools.summary --list)
        name="resnet20",
        # basebn's ResNets only (resnet20/32/44/56/110, resnet18/34/50): "small" = 3x3 stem for 28-32 px
        # inputs, "imagenet" = 7x7/2 conv + max-pool
        stem="small",
        # stride of the "small" stem (2 quarters the compute on 28 px inputs)
        stem_stride=1,
        # first-stage width; None = the architecture's default (16 CIFAR-style, 64 ImageNet-style)
        base_width=None,
        # BN, SyncBN, FrozenBN or GN
        norm="BN",
        # start from these weights: a checkpoint file, a run directory, or zoo:NAME
        weights=None,
        # basebn's ResNets: each residual branch's last BN starts at gamma 0
        zero_init_residual=True,
    ),
    loss=dict(
        # label smoothing in [0, 1)
        label_smooth=0.0,
    ),
    solver=dict(
        # sgd or adamw
        optimizer="sgd",
        # learning rate per process; the total lr is basic_lr * world_size (linear scaling, as basecls)
        basic_lr=0.1,
        momentum=0.9,
        weight_decay=5e-4,
        nesterov=False,
        # adamw betas
        betas=(0.9, 0.999),
        # exclude norm-layer parameters and biases from weight decay
        weight_decay_exclude_norm_bias=True,
        max_epoch=10,
        # linear warm-up from basic_lr * warmup_factor, per iteration
        warmup_epochs=1,
        warmup_factor=0.1,
        # cosine, step or linear (per iteration)
        lr_schedule="cosine",
        # epochs at which "step" multiplies the lr by lr_decay_factor
        lr_decay_steps=(30, 60, 90),
        lr_decay_factor=0.1,
        # the lr ends at basic_lr * lr_min_factor (cosine, linear)
        lr_min_factor=0.0,
        grad_clip=dict(
            # None, "norm" or "value"
            name=None,
            max_norm=float("inf"),
            lower=float("-inf"),
            upper=float("inf"),
        ),
        # an optimizer step every N iterations (gradients accumulate in between)
        accumulation_steps=1,
    ),
    model_ema=dict(
        enabled=False,
        momentum=0.9999,
        # update every N iterations
        update_period=1,
        # 0-based epoch from which the EMA averages; before it the EMA copies the model
        start_epoch=0,
        # if set, momentum = max(0, 1 - alpha * total_batch_size / max_epoch * update_period) (pycls)
        alpha=None,
        # copy BN buffers instead of averaging them
        copy_buffers=False,
    ),
    bn=dict(
        # BN running-stat momentum (MegEngine convention: running = m * running + (1 - m) * batch) and eps
        # for every BN layer; None = the model family's own (0.9 / 1e-5 for ResNets, 0.99 / 1e-3 EfficientNet)
        momentum=None,
        eps=None,
        # precise BN every N epochs; inf = off, -1 = after the last epoch only
        precise_every_n_epoch=float("inf"),
        num_samples_precise=8192,
        # pooled (population statistics) or batch_average (pycls/basecls behaviour, for comparison)
        precise_method="pooled",
        # keep every BN layer in eval mode while training (fine-tuning)
        norm_eval=False,
        # fold BN into the preceding conv on the fly whenever BN runs in eval mode
        efficient_conv_bn_eval=True,
    ),
    amp=dict(
        # mixed precision (GPU only)
        enabled=False,
        dynamic_scale=False,
    ),
    # compile the training step with megengine.jit.trace
    trace=False,
    log_every_n_iter=20,
    # keep an epoch_N checkpoint every N epochs (latest is always kept); inf = never
    save_every_n_epoch=1,
    # evaluate every N epochs (and always after the last); inf = only after the last
    eval_every_n_epoch=1,
)


class BaseConfig(ConfigDict):
    """The defaults above; subclass it in configs/ and merge your changes."""

    def __init__(self, values_or_file=None, **kwargs):
        super().__init__(DEFAULTS)
        if values_or_file is not None or kwargs:
            self.merge(values_or_file, **kwargs)
