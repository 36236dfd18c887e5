"""Normalisation layers and BN ops. Each feature lives in its own module; this file only re-exports."""
from .frozen_bn import FrozenBatchNorm2d  # noqa: E402,F401
from .conv_bn import (  # noqa: E402,F401
    disable_efficient_conv_bn_eval,
    efficient_conv_bn_pairs,
    enable_efficient_conv_bn_eval,
    find_conv_bn_pairs,
    fold_conv_bn,
    fuse_conv_bn,
)
from .sync_bn import SyncBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm  # noqa: E402,F401
from .bn_ops import (  # noqa: E402,F401
    backend as bn_backend,
    bn_backward_elemt,
    bn_backward_reduce,
    bn_normalize,
    bn_stats,
    use_backend as use_bn_backend,
)
