"""Build the normalisation layer a config names (model.norm)."""
import megengine.module as M

NORM_KINDS = ("BN", "SyncBN", "FrozenBN", "GN")


def build_norm(kind, num_features, momentum=0.9, eps=1e-5, gn_groups=32):
    """Return a 2D normalisation module of `kind` in NORM_KINDS for `num_features` channels."""
    if kind == "BN":
        return M.BatchNorm2d(num_features, eps=eps, momentum=momentum)
    if kind == "SyncBN":
        from .sync_bn import SyncBatchNorm

        return SyncBatchNorm(num_features, eps=eps, momentum=momentum)
    if kind == "FrozenBN":
        from .frozen_bn import FrozenBatchNorm2d

        return FrozenBatchNorm2d(num_features, eps=eps)
    if kind == "GN":
        groups = min(gn_groups, num_features)
        while num_features % groups:  # largest group count <= gn_groups that divides the channels
            groups -= 1
        return M.GroupNorm(groups, num_features, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: model.norm must be one of {', '.join(NORM_KINDS)}")
