"""MegEngine Hub entry points: ``megengine.hub.load("OWNER/basebn", "resnet50", pretrained=True)``.

One entry point per basebn model name (basebn.models.list_models()); ``NAME(pretrained=False, **kwargs)``
builds it with ``build_model(NAME, **kwargs)``. ``pretrained=True`` loads, where basebn's zoo has an entry for
the model, the first such entry (its own config: classes, channels, widths); otherwise basecls's published
ImageNet weights (``basecls:NAME``: downloaded once, sha256-recorded, made RGB-input; 1000 classes, another
``num_classes`` gets a new head); a name with neither raises ValueError. Everything public here that is
callable is an entry point (MegEngine Hub's rule), so helpers are private.
"""
import numpy as __np

from basebn.engine.build import build_model_from_cfg as __build_from_cfg
from basebn.engine.build import zoo_config as __zoo_config
from basebn.models import build_model as __build_model
from basebn.models import list_models as __list_models
from basebn.models import load_weights as __load_weights
from basebn.models.convert.basecls_weights import BASECLS_WEIGHTS as __BASECLS_WEIGHTS
from basebn.zoo import list_entries as __list_entries
from basebn.zoo import load_zoo_weights as __load_zoo_weights

dependencies = ["megengine", "numpy", "cv2", "loguru", "basecore", "safetensors", "tensorboardX"]


def __zoo_entry_for(name):
    """The first zoo entry whose config builds model `name`, else None."""
    for entry in __list_entries():
        if __zoo_config(entry["name"]).model.name == name:
            return entry["name"]
    return None


def __from_zoo(entry):
    cfg = __zoo_config(entry)
    state = __load_zoo_weights(entry)
    in_channels = cfg.data.channels or next(__np.shape(v)[1] for v in state.values() if __np.ndim(v) == 4)
    model = __build_from_cfg(cfg, in_channels)
    __load_weights(model, f"zoo:{entry}")
    return model


def __entry_point(name):
    def entry(pretrained=False, **kwargs):
        if not pretrained:
            return __build_model(name, **kwargs)
        zoo = __zoo_entry_for(name)
        if zoo is not None:
            if kwargs:
                raise ValueError(f"{name}(pretrained=True) loads zoo entry {zoo!r} as its config builds it; drop "
                                 f"{sorted(kwargs)} (or build with pretrained=False and load weights yourself)")
            return __from_zoo(zoo)
        if name in __BASECLS_WEIGHTS:
            model = __build_model(name, **{"num_classes": 1000, **kwargs})
            __load_weights(model, f"basecls:{name}", allow_new_head=True)
            return model
        raise ValueError(f"{name}: neither basebn's zoo nor basecls publishes weights for it; use pretrained=False")

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (f"basebn's {name}; pretrained=True: the zoo's weights for it if any, else basecls's published "
                     f"ImageNet weights. kwargs go to basebn.models.build_model.")
    return entry


globals().update({__name: __entry_point(__name) for __name in __list_models()})
