"""The default config schema. Every key a run may set is here, with what it means.

Experiment files in configs/ derive from BaseConfig; command-line KEY=VALUE pairs override it.
Names follow basecls where it has them.
"""
from basecore.config import ConfigDict

__all__ = ["BaseConfig", "DEFAULTS"]

DEFAULTS = dict(
    # mini-batch size per process (the total batch is batch_size * world_size)
    batch_size=128,
    # images per batch of evaluation and of basebn.test (its --adapt methods included), per process;
    # None = batch_size (pycls's TEST.BATCH_SIZE, timm's --validation-batch-size)
    test_batch_size=None,
    num_classes=10,
    # run directory; None means runs/<config file name>, or runs/<config file name>-<model.name> when an override
    # chose another model than the file's
    output_dir=None,
    seed=42,
    data=dict(
        # one of: synthetic (embedded, no files needed), fashion_mnist, mnist, cifar10, cifar100, imagefolder
        name="synthetic",
        # dataset directory; None = the dataset's default (fashion_mnist: Debian's dataset-fashion-mnist)
        root=None,
        # resize images to this square size (imagefolder) / generated size (synthetic); None = native
        image_size=None,
        # None = the dataset's own channel count (imagefolder: 3 if its training images include colour, else 1)
        channels=None,
        # imagefolder: the class folder names in label order (num_classes of them); None = the training split's
        # class folders, sorted. Val folders map to these labels by name
        classes=None,
        # random-crop zero padding in pixels (0 disables random crop); None = the dataset's default
        pad=None,
        # random horizontal flips; None = the dataset's default (off for MNIST digits)
        hflip=None,
        # per-channel normalisation in 0-255 units; None = the dataset's defaults
        mean=None,
        std=None,
        # --- training augmentation (basebn.data.augment; timm/basecls names and semantics) ---
        # train crop: "random_resized" (RandomResizedCrop) or "pad" (resize to image_size, zero-pad by
        # data.pad, random crop); None = the dataset's default (random_resized for imagefolder, else pad)
        train_crop=None,
        # eval: resize the shorter side to floor(image_size / crop_pct), then center crop image_size
        crop_pct=0.875,
        # resizing filter (cv2; also the AutoAugment/RandAugment geometric ops): bilinear, bicubic, area, nearest
        interpolation="bilinear",
        # RandomResizedCrop: area fraction range and aspect-ratio (w/h) range, log-uniform
        rrc_scale=(0.08, 1.0),
        rrc_ratio=(3 / 4, 4 / 3),
        # ColorJitter strengths: None (off), one number for all three, or (brightness, contrast, saturation);
        # each factor is uniform in [max(0, 1 - s), 1 + s], the three ops in random order (torchvision)
        color_jitter=None,
        # PCA lighting noise std (AlexNet/pycls/basecls use 0.1 on ImageNet); 0 = off; 3-channel images only
        lighting=0.0,
        # None, a timm RandAugment string ("rand-m9-mstd0.5", sections m, n, mstd, mmax, inc, p) or an
        # AutoAugment ImageNet policy ("autoaugment" = "original", or "v0"; optional "-mstd0.5")
        auto_augment=None,
        # random erasing (timm): probability per image, erased area fraction range, min aspect (h/w is
        # log-uniform in [aspect, 1/aspect]), fill "const" (0 = mean colour), "rand" (random colour per
        # box) or "pixel" (per-pixel N(0, 1) noise, normalised units), up to `count` boxes per image
        random_erasing=dict(prob=0.0, area=(0.02, 1 / 3), aspect=0.3, mode="const", count=1),
        # Mixup / CutMix Beta(alpha, alpha) parameters; 0 = off (either on gives soft targets)
        mixup=0.0,
        cutmix=0.0,
        # probability that a batch is mixed at all, and of CutMix rather than Mixup when both are on
        mix_prob=1.0,
        mix_switch_prob=0.5,
        # synthetic dataset sizes
        train_size=6000,
        test_size=1000,  # synthetic: test images generated
        # use only the first N samples (of a fixed permutation); None = all
        max_train_samples=None,
        max_test_samples=None,  # the same for the test split
        # batches prepared ahead of the trainer by each worker (num_workers=0: by one background thread);
        # 0 = none; None = 2; True/False (older configs) are read as 2/0
        prefetch=None,
        # worker processes that decode and augment batches (handed over through shared memory); 0 = in the
        # training process; None = the CPUs available to the process (at most 8) for image folders and per-image
        # transforms, 0 for in-memory datasets with vectorised augmentation. Batches are identical for any count.
        num_workers=None,
        # replace an unreadable/corrupt image by another sample (deterministically) and count them in one warning
        # per epoch, instead of stopping with an error naming the file
        skip_bad_images=False,
        # repeated augmentation (DeiT / timm RepeatAugSampler): each chosen image N times per epoch, spread over the
        # ranks with different augmentations; the epoch keeps about len(dataset) samples. 1 = off
        repeated_aug=1,
        # class batches (non-i.i.d. batches as in Ioffe 2017's Batch Renormalization experiment, metric learning):
        # each training batch of a process holds exactly this many classes, batch_size / classes_per_batch examples
        # of each, no sample twice per epoch while the classes suffice (docs/data.md); with several processes a
        # step's ranks take different classes when the dataset has classes_per_batch x world_size. 0 = off
        # (i.i.d. batches). Not with repeated_aug; precise BN keeps i.i.d. batches
        classes_per_batch=0,
        # class batches: a class's examples in a batch come as groups of this many same-label examples, the groups
        # in random order (2 = Ioffe's same-label pairs); classes_per_batch x examples_per_class must divide
        # batch_size. None or 0 = batch_size // classes_per_batch (one group per class)
        examples_per_class=None,
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
        # start from these weights: a checkpoint file, a run directory, zoo:NAME, basecls:PATH (a basecls
        # checkpoint) or timm:PATH (a timm .safetensors file)
        weights=None,
        # each residual branch's last norm starts at gamma 0 (Goyal et al. 2017), in every family whose blocks end
        # in a norm (basebn.models.ZERO_INIT_FAMILIES); None = the family's default: on for basebn's ResNets,
        # off for basecls's families (as basecls). True for another family (e.g. wrn_*, vgg*_bn) is refused
        zero_init_residual=None,
    ),
    loss=dict(
        # label smoothing in [0, 1)
        label_smooth=0.0,
        # "ce" (softmax cross-entropy; soft targets with Mixup/CutMix) or "bce" (sigmoid binary
        # cross-entropy per class against the (smoothed or mixed) one-hot targets, as timm's --bce-loss)
        name="ce",
    ),
    solver=dict(
        # sgd or adamw
        optimizer="sgd",
        # learning rate per process; the total lr is basic_lr * world_size (linear scaling, as basecls)
        basic_lr=0.1,
        momentum=0.9,  # SGD momentum
        weight_decay=5e-4,  # L2 weight decay (decoupled for adamw)
        nesterov=False,  # SGD Nesterov momentum
        # adamw betas
        betas=(0.9, 0.999),
        # exclude norm-layer parameters and biases from weight decay
        weight_decay_exclude_norm_bias=True,
        max_epoch=10,
        # linear warm-up from basic_lr * warmup_factor, per iteration
        warmup_epochs=1,
        warmup_factor=0.1,  # the warm-up starts at basic_lr * warmup_factor
        # cosine, step or linear (per iteration)
        lr_schedule="cosine",
        # epochs at which "step" multiplies the lr by lr_decay_factor
        lr_decay_steps=(30, 60, 90),
        lr_decay_factor=0.1,  # "step": lr multiplier at each of lr_decay_steps
        # the lr ends at basic_lr * lr_min_factor (cosine, linear)
        lr_min_factor=0.0,
        grad_clip=dict(
            # None, "norm" or "value"
            name=None,
            max_norm=float("inf"),  # "norm": the global gradient norm is clipped to this
            lower=float("-inf"),  # "value": each gradient element is clipped to [lower, upper]
            upper=float("inf"),  # (the upper end of that interval)
        ),
        # an optimizer step every N iterations (gradients accumulate in between)
        accumulation_steps=1,
    ),
    model_ema=dict(
        enabled=False,  # keep an exponential moving average of the weights (timm ModelEma)
        momentum=0.9999,  # e = momentum * e + (1 - momentum) * p, unless alpha is set
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
        # for every BN layer; None = the model family's own (basecls's 0.9 / 1e-5 for every family)
        momentum=None,
        eps=None,
        # precise BN every N epochs; inf = off, -1 = after the last epoch only
        precise_every_n_epoch=float("inf"),
        num_samples_precise=8192,
        # images per batch of the precise-BN pass (precise_method="batch_average" averages per-batch statistics,
        # so it depends on it); None = the training normalization batch size: bn.norm_batch_size, else batch_size
        precise_batch_size=None,
        # pooled (population statistics) or batch_average (pycls/basecls behaviour, for comparison)
        precise_method="pooled",
        # keep every BN layer in eval mode while training (fine-tuning)
        norm_eval=False,
        # fold BN into the preceding conv on the fly whenever BN runs in eval mode
        efficient_conv_bn_eval=True,
        # --- BN in training (docs/bn_training.md) ---
        # ghost BN: training batches normalised in groups of this many samples (model.norm="BN"; must divide
        # batch_size); None = the whole per-process batch
        norm_batch_size=None,
        # Batch Renormalization (model.norm="BRN"/"SyncBRN"): final clip limits, plain BN (r_max 1, d_max 0) for
        # warmup_epochs, then linear per iteration to the final values over ramp_epochs
        renorm=dict(r_max=3.0, d_max=5.0, warmup_epochs=1, ramp_epochs=2),
        # with solver.accumulation_steps > 1: running statistics updated once per optimizer step with the pooled
        # statistics of its micro-batches (False: once per micro-batch, the old behaviour)
        accumulation_aware=True,
        # multi-process runs: local BN running statistics made equal on every rank before each evaluation,
        # checkpoint and precise-BN pass: "mean" (averaged), "broadcast" (rank 0's) or "off"
        sync_buffers="mean",
        # the last N epochs train with every BN layer on its running statistics (precise BN first, when on);
        # 0 = off
        freeze_last_epochs=0,
    ),
    amp=dict(
        # mixed precision (GPU only)
        enabled=False,
        dynamic_scale=False,  # dynamic loss scaling (grows/backs off with overflow); False = a static scale
    ),
    # compile the training step with megengine.jit.trace
    trace=False,
    log_every_n_iter=20,  # a log line (loss, lr, speed) every N iterations, and at least four per epoch
    log=dict(
        # TensorBoard event files in the run directory itself (events.out.tfevents.*; rank 0; tensorboardX): loss,
        # lr, times, images/s every log_every_n_iter iterations, evaluation metrics, precise-BN drift per layer.
        # `tensorboard --logdir runs`
        tensorboard=True,
    ),
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
