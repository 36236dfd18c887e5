"""Layers, BN ops and model-level BN tools; each in its own module, the BN API re-exported here.

BN modules import one way (docs/bn_design.md): precise_bn, convert -> conv_bn -> graph -> norm ->
sync_bn, frozen_bn -> bn_ops, moments, conv, module_tree.
"""
from .bn_ops import (  # noqa: F401
    backend as bn_backend,
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
from .convert import (  # noqa: F401
    convert_frozen_batchnorm,
    convert_sync_batchnorm,
    convert_to_batchnorm,
    revert_sync_batchnorm,
)
from .frozen_bn import FrozenBatchNorm2d  # noqa: F401
from .norm import build_norm, bn_layers, is_bn, is_norm, uses_running_stats  # noqa: F401
from .precise_bn import collect_bn_population_stats, update_bn_stats  # noqa: F401
from .sync_bn import SyncBatchNorm, local_statistics  # noqa: F401
