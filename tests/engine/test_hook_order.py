"""The order of the hook list is not a correctness requirement: a tiny synthetic run (EMA, precise BN,
evaluation and checkpoints every epoch) with default_hooks' list reversed writes the same metrics.jsonl and
the same checkpoints as with the list as built. The reference is the run with the list as built."""
import os

import numpy as np

from basebn.checkpoint import load_checkpoint
from basebn.config import BaseConfig
from basebn.engine.build import (build_data, build_ema, build_precise_bn_loader, build_train_data, build_train_model,
                                 build_trainer, scaled_base_lr)
from basebn.engine.hooks import default_hooks
from basebn.engine.optimizer import build_optimizer
from basebn.engine.run_record import RunRecord
from basebn.train import seed_all

EPOCHS = 3


def tiny_cfg():
    cfg = BaseConfig()
    cfg.merge(dict(batch_size=16, seed=5, data=dict(name="synthetic", image_size=8, train_size=48, test_size=40,
                                                    pad=1, prefetch=False, num_workers=0),
                   model=dict(name="resnet20", base_width=2), solver=dict(max_epoch=EPOCHS, warmup_epochs=1),
                   model_ema=dict(enabled=True, momentum=0.5), eval_every_n_epoch=1, save_every_n_epoch=1,
                   bn=dict(precise_every_n_epoch=1, num_samples_precise=32), log_every_n_iter=1))
    return cfg


def train_tiny(run_dir, reorder):
    os.makedirs(run_dir)
    cfg = tiny_cfg()
    seed_all(cfg.seed)
    train_ds, train_loader = build_train_data(cfg)
    _, test_loader = build_data(cfg, train=False)
    model = build_train_model(cfg, train_ds)
    base_lr = scaled_base_lr(cfg)
    optimizer = build_optimizer(model, cfg.solver, base_lr)
    record = RunRecord()
    hooks = reorder(default_hooks(cfg, base_lr, run_dir, test_loader, build_precise_bn_loader(cfg), record))
    trainer = build_trainer(cfg, model, train_loader, optimizer, hooks, ema=build_ema(cfg, model), record=record)
    trainer.train(start_info=[1, 1], max_info=[EPOCHS, len(train_loader)])
    return record


def assert_same(a, b, where):
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_files(run_dir):
    """(sorted file names but TensorBoard's, number of TensorBoard event files): event files are named by their
    wall-clock time, so they are compared by count."""
    names = sorted(os.listdir(run_dir))
    events = [n for n in names if n.startswith("events.out.tfevents.")]
    return [n for n in names if n not in events], len(events)


def test_reversed_hook_list_writes_the_same_files(tmp_path):
    as_built, reversed_ = str(tmp_path / "as_built"), str(tmp_path / "reversed")
    record = train_tiny(as_built, list)
    train_tiny(reversed_, lambda hooks: hooks[::-1])
    files, events = run_files(as_built)
    assert (files, events) == run_files(reversed_) and events == 1
    assert {"metrics.jsonl", "best.npz", "latest.npz", "final.npz", "epoch_1.npz", "epoch_3.npz"} <= set(files)
    with open(os.path.join(as_built, "metrics.jsonl")) as f, open(os.path.join(reversed_, "metrics.jsonl")) as g:
        rows = f.read()
        assert rows == g.read()
    assert len(rows.splitlines()) == EPOCHS and "ema_top1" in rows
    for name in files:
        if name.endswith(".npz"):
            assert_same(load_checkpoint(os.path.join(as_built, name)),
                        load_checkpoint(os.path.join(reversed_, name)), name)
    best = load_checkpoint(os.path.join(as_built, "best.npz"))
    assert best["epoch"] == record.best_epoch  # best.npz holds the epoch the record calls best
