"""Whether tensors hold a NaN or inf, in few MegEngine ops and one host read: the training step's gradient check
and test-time adaptation's."""
import numpy as np

import megengine.functional as F

__all__ = ["all_finite"]

_CONCAT_MAX = 1 << 16  # tensors up to this many values are concatenated with their like, not summed alone


def all_finite(tensors):
    """True when no tensor of `tensors` holds a NaN or inf, read from the sum of all their values (non-finite when
    one is; a sum past float32's range, from values near 1e38, counts as non-finite too).

    One host read and few ops: tensors of up to _CONCAT_MAX values that fit one concatenation (the same shape but
    along one axis: norm weights, convs of one width) are concatenated and summed once, larger ones summed alone,
    then one stack and one sum (ResNet-20's 65 gradients: 15 ops, 288 per iteration with the check and 273
    without; MobileNetV2 647 and 613). MegEngine's fused ``CheckNonFinite`` is one op but a naive kernel that
    first copies every input: 2x slower than these ops on ResNet-20's gradients, 14x on ResNet-18's.
    """
    groups, sums = {}, []
    for t in tensors:
        shape = tuple(t.shape)
        if not shape or t.size > _CONCAT_MAX:
            sums.append(F.sum(t))
            continue
        axis = int(np.argmax(shape)) if sum(d > 1 for d in shape) <= 1 else 0  # a vector's long axis
        groups.setdefault((axis, shape[:axis] + shape[axis + 1:]), []).append(t)
    for (axis, _), members in groups.items():
        sums.append(F.sum(F.concat(members, axis=axis) if len(members) > 1 else members[0]))
    if not sums:
        return True
    total = sums[0] if len(sums) == 1 else F.stack(sums).sum()
    return bool(np.isfinite(total.item()))
