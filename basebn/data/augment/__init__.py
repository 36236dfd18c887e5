"""Image augmentations for training: per-sample transforms, batch augmentation, Mixup/CutMix.

The loader calls the three builders; each returned callable draws all its randomness from the
numpy Generator it is given, so a batch depends only on the loader's (seed, epoch, rank, batch).
"""

from .auto_augment import AugmentPolicy, apply_policy, parse_policy
from .erasing import ERASE_MODES, ErasingSpec, random_erase
from .geometry import INTERPOLATIONS
from .mix import MixSpec, mix_batch
from .pipeline import (TRAIN_CROPS, BatchAugment, Mixer, SampleTransform, build_batch_augment,
                       build_mixer, build_sample_transform, erasing_spec)

__all__ = ["build_sample_transform", "build_batch_augment", "build_mixer", "SampleTransform",
           "BatchAugment", "Mixer", "TRAIN_CROPS", "AugmentPolicy", "parse_policy", "apply_policy",
           "ErasingSpec", "ERASE_MODES", "INTERPOLATIONS", "random_erase", "erasing_spec", "MixSpec", "mix_batch"]
