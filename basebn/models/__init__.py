"""Model zoo architectures. MODELS maps config names to constructors (an explicit table, no import side effects)."""
from .resnet import ResNet, resnet18, resnet20, resnet32, resnet34, resnet50, resnet56
from .weights import load_weights, read_weights

MODELS = {
    "resnet20": resnet20,
    "resnet32": resnet32,
    "resnet56": resnet56,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
}


def list_models():
    """Names build_model accepts, in table order."""
    return list(MODELS)


def build_model(name, **kwargs):
    """Build model `name` (a key of MODELS); kwargs go to the constructor (num_classes, in_channels, norm, ...)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: model.name must be one of {', '.join(sorted(MODELS))}")
    return MODELS[name](**kwargs)
