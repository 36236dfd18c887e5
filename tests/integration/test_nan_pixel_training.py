"""One NaN pixel in one training image, through the CLI: the optimizer step of its batch is skipped (MegEngine's
relu(nan) is 0, so the loss stays finite while the gradients do not), the run ends normally and says so, and every
array it saves (model, EMA, optimizer) is finite."""
import os

import numpy as np

from tests.support.cli import TINY, run, write_config

# The training loader (seed 3; precise BN's is seed 4) gives image 0 of batch 2 in the second epoch (0-based 1)
# one NaN pixel: a float dataset with one bad value.
NAN_PIXEL = TINY + '''
import numpy as np
from basebn.data.loader import BatchLoader
_build_batch = BatchLoader.build_batch
def _one_nan_pixel(self, epoch, batch):
    x, y, replaced = _build_batch(self, epoch, batch)
    if self.train and self.seed == 3 and epoch == 1 and batch == 2:
        x = x.copy()
        x[0, 0, 4, 4] = np.nan
    return x, y, replaced
BatchLoader.build_batch = _one_nan_pixel
'''
SAVED = ("latest.npz", "final.npz", "best.npz", "epoch_1.npz", "epoch_2.npz")


def test_nan_pixel_skips_its_step_and_every_saved_array_is_finite(tmp_path):
    config = write_config(tmp_path, NAN_PIXEL)
    run_dir = str(tmp_path / "run")
    r = run(["basebn.train", config, f"output_dir={run_dir}", "model_ema.enabled=True", "data.num_workers=0"])
    assert r.returncode == 0, r.stderr
    assert "optimizer step skipped at epoch 2 iteration 3" in r.stderr, r.stderr
    assert "epoch 2: 1 optimizer step(s) skipped for non-finite gradients" in r.stderr
    checked = 0
    for name in SAVED:
        with np.load(os.path.join(run_dir, name), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k not in ("__meta__", "__sha256__")}
        assert any(k.startswith("ema/") for k in arrays), name  # the EMA is saved, and checked with the rest
        for key, a in arrays.items():
            if np.issubdtype(a.dtype, np.floating):
                assert np.isfinite(a).all(), f"{name}: {key}"
                checked += 1
    assert checked > 100
