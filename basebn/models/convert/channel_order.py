"""basecls's models take BGR images (it decodes with cv2); basebn's pipeline gives RGB: every basecls checkpoint
(``basecls:PATH`` and ``basecls:NAME``) gets its image-input convs' input channels reversed on load, so basebn's
model on the RGB image gives the logits basecls's model gives on the BGR one (exact: a permutation of weights).
"""
import megengine.module as M
import numpy as np

from ...checkpoint import CheckpointError

__all__ = ["bgr_to_rgb_input"]


def bgr_to_rgb_input(state, model):
    """`state` with the input channels of `model`'s image-input convs (Conv2d with 3 input channels, one group)
    reversed: basecls's BGR-input weights for basebn's RGB images."""
    keys = [f"{name}.weight" for name, m in model.named_modules()
            if isinstance(m, M.Conv2d) and m.in_channels == 3 and m.groups == 1]
    if not keys:
        raise CheckpointError(f"{getattr(model, 'arch_name', 'the model')}: no 3-channel input conv found to take "
                              f"basecls's BGR weights to RGB")
    out = dict(state)
    for key in keys:
        out[key] = np.ascontiguousarray(np.asarray(state[key])[:, ::-1])
    return out
