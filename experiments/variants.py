"""Shared by the experiment scripts: top-1 of a run's weights (model or EMA) with running statistics or after
precise BN, cached in the run directory so tables can be re-printed without re-evaluating."""
import json
import os

from basebn.engine.build import build_data, build_model_from_cfg
from basebn.models import load_weights
from basebn.engine.evaluate import evaluate
from basebn.layers.precise_bn import update_bn_stats


def evaluate_variants(cfg, run_dir, variants, precise_samples, cache_name="eval.json"):
    """{(weights, method): top1} for weights in {model, ema}, method in {running, pooled, batch_average}.

    Precise BN reads the training split with seed cfg.seed + 1 (not the training order). Results are cached
    in run_dir/cache_name; delete the file to re-evaluate."""
    cache = os.path.join(run_dir, cache_name)
    done = {}
    if os.path.isfile(cache):
        with open(cache) as f:
            done = {tuple(k.split("/")): v for k, v in json.load(f).items()}
    todo = [v for v in variants if v not in done]
    if todo:
        test_ds, test_loader = build_data(cfg, train=False)
        _, train_loader = build_data(cfg.clone().merge({"seed": cfg.seed + 1}), train=True)
        for which, method in todo:
            model = build_model_from_cfg(cfg, in_channels=test_ds.image_shape[0])
            load_weights(model, run_dir, ema=which == "ema")
            if method != "running":
                train_loader.set_epoch(0)
                update_bn_stats(model, train_loader, precise_samples, method=method)
            done[(which, method)] = evaluate(model, test_loader)["top1"]
            with open(cache, "w") as f:
                json.dump({f"{w}/{m}": v for (w, m), v in done.items()}, f, indent=1)
    return {v: done[v] for v in variants}
