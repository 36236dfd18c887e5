"""nn modules, their autodiff Functions and the model-wide BN tools, each in its own module; the public API
re-exported here, with the BN ops' names from :mod:`basebn.ops.bn_ops`. Where the package sits in the layering:
docs/layout.md (checked by tests/test_architecture.py); what each module holds: docs/bn_design.md.
"""
from .activation import HSigmoid, HSwish, PassThrough, ReLU6, Swish, build_activation  # noqa: F401
from .batch_norm import BatchNorm2d  # noqa: F401
from .bn_act import BatchNormAct2d, FrozenBatchNormAct2d, SyncBatchNormAct2d, norm_act, with_act  # noqa: F401
from .batch_renorm import BatchRenorm2d, SyncBatchRenorm, renorm_limits_at, set_renorm_limits  # noqa: F401
from .bn_accumulation import BNStatsAccumulator, accumulate_bn_stats  # noqa: F401
from .bn_guard import restore_running_stats, snapshot_running_stats, take_nonfinite_counts  # noqa: F401
from ..ops.bn_ops import (  # noqa: F401
    backend as bn_backend,
    bn_act_backward_elemt,
    bn_act_backward_reduce,
    bn_act_normalize,
    bn_backward_elemt,
    bn_backward_reduce,
    bn_normalize,
    bn_stats,
    use_backend as use_bn_backend,
)
from .conv_bn import (  # noqa: F401
    disable_efficient_conv_bn_eval,
    efficient_conv_bn_pairs,
    enable_efficient_conv_bn_eval,
    find_conv_bn_pairs,
    fold_conv_bn,
    fuse_conv_bn,
)
from .channel_shuffle import channel_shuffle, shuffle_split  # noqa: F401
from .conv_norm_act import ConvNormAct, padded_conv  # noqa: F401
from .convert import (  # noqa: F401
    convert_frozen_batchnorm,
    convert_sync_batchnorm,
    convert_to_batchnorm,
    revert_sync_batchnorm,
)
from .divisible import make_divisible  # noqa: F401
from .drop_path import DropPath, drop_path  # noqa: F401
from .frozen_bn import FrozenBatchNorm2d  # noqa: F401
from .linear import Linear  # noqa: F401
from .max_pool import MaxPool2d, max_pool2d  # noqa: F401
from .norm import build_norm, bn_layers, is_bn, is_norm, set_norm_batch_size, uses_running_stats  # noqa: F401
from .pooling import AdaptiveAvgPool2d, GlobalAvgPool2d  # noqa: F401
from .precise_bn import collect_bn_population_stats, update_bn_stats  # noqa: F401
from .se import SqueezeExcite, se_width  # noqa: F401
from .sync_bn import SyncBatchNorm, local_statistics  # noqa: F401
from .deprecated_paths import install as _install_deprecated_paths

_install_deprecated_paths()  # the ops' old paths (basebn.layers.conv_ops, ...) still import, with a warning
