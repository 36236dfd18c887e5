"""build_model refuses a classifier without outputs or a model without input channels in one ValueError, before
anything is built (num_classes=0 used to build and print MKL errors in its forward)."""
import numpy as np
import pytest

from basebn.models import build_model


@pytest.mark.parametrize("key, value", [("num_classes", 0), ("num_classes", -3), ("num_classes", 2.5),
                                        ("num_classes", True), ("in_channels", 0), ("in_channels", "3")])
def test_counts_below_one_or_not_whole_are_refused(key, value):
    kwargs = {"num_classes": 10, "in_channels": 3, key: value}
    with pytest.raises(ValueError) as info:
        build_model("resnet20", base_width=4, **kwargs)
    assert str(info.value) == f"build_model: {key} must be a whole number >= 1, got {value!r}"


def test_one_class_and_numpy_counts_still_build():
    model = build_model("resnet20", num_classes=np.int64(1), in_channels=np.int32(2), base_width=4)
    assert tuple(model.fc.weight.shape)[0] == 1 and tuple(model.conv1.weight.shape)[1] == 2
