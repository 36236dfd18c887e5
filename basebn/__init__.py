"""basebn: a MegEngine image-classification trainer that gets BatchNorm right and fast."""

__version__ = "0.1.0"
