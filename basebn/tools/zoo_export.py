"""python -m basebn.tools.zoo_export RUN_DIR NAME --config C [--ema] [--precise-bn N] [--method pooled|batch_average]

Turns a finished run into a zoo entry: evaluates the chosen weights (optionally after precise BN),
writes ZOO/NAME.npz (pickle-free), and adds/updates the entry in ZOO/zoo.json and ZOO/README.md (ZOO is
basebn.zoo.zoo_dir(); all three written atomically). The entry's command is the training command given
with --command followed by this export's own invocation (written by export_invocation, so the recorded
command always runs as shown). The entry's config path follows the zoo's rule (basebn/zoo/index.py): it must
lie inside the zoo's config root, and the sha256 of it and of the configs it derives from are recorded
(config_sha256), without which basebn never runs an entry's config.
"""
import argparse
import json
import os
import shlex
import sys
from typing import Any, Dict, Tuple

from ..checkpoint import model_state, save_npz_weights
from ..cli import cli_main
from ..config import BaseConfig, flatten, load_config
from ..engine.build import build_data, build_model_from_cfg
from ..engine.evaluate import evaluate
from ..layers.precise_bn import update_bn_stats
from ..models import load_weights
from ..utils.fs import atomic_write_bytes, sha256_of
from ..zoo import ZooError, config_hashes, config_root, list_entries, zoo_dir, zoo_index_path
from ..zoo.config_files import is_inside, relative_key

__all__ = ["export", "export_invocation", "render_readme", "build_parser", "main"]

MODULE = "basebn.tools.zoo_export"


def _overrides(run_cfg, config_path):
    """KEY=VALUE pairs that turn config_path into the run's config (config.json stores tuples as lists)."""
    def norm(v):
        return list(v) if isinstance(v, tuple) else v

    base = flatten(load_config(config_path))
    return [f"{k}={v!r}" for k, v in flatten(run_cfg).items() if k != "output_dir" and norm(base.get(k)) != norm(v)]


def render_readme(entries):
    """zoo/README.md text: one table row per entry."""
    lines = ["# basebn model zoo", "",
             "Evaluate: `python -m basebn.test zoo:NAME --json`. Fine-tune: "
             "`python -m basebn.train CONFIG model.weights=zoo:NAME`.", "",
             "| name | dataset | top-1 | top-5 | config | trained with |", "|---|---|---|---|---|---|"]
    for e in entries:
        lines.append(f"| {e['name']} | {e['dataset']} | {e['top1']:.2f} | {e['top5']:.2f} | `{e['config']}` | "
                     f"`{e['command']}` |")
    return "\n".join(lines) + "\n"


def export(run_dir: str, name: str, ema: bool = False, precise_bn: int = 0,
           method: str = "pooled") -> Tuple[Dict[str, Any], str]:
    """Evaluate the run's weights (after precise BN with precise_bn > 0) and write ZOO/NAME.npz.

    Args:
        run_dir: the training run's directory.
        name: the zoo entry's name.
        ema: export the EMA weights.
        precise_bn: training images for a precise BN pass before evaluating; 0: none.
        method: the precise BN method, ``"pooled"`` or ``"batch_average"``.

    Returns:
        (the evaluation metrics, the path of the written weights).
    """
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = BaseConfig(json.load(f))
    ds, loader = build_data(cfg, train=False)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    load_weights(model, run_dir, ema=ema)
    if precise_bn:
        _, train_loader = build_data(cfg.clone().merge({"seed": cfg.seed + 1}), train=True)
        train_loader.set_epoch(0)
        update_bn_stats(model, train_loader, precise_bn, method=method, progress=True)
    metrics = evaluate(model, loader, progress=True)
    path = os.path.join(zoo_dir(), f"{name}.npz")
    save_npz_weights(path, model_state(model), meta={"name": name, **metrics})
    return metrics, path


def export_invocation(run_dir, name, config, ema=False, precise_bn=0, method="pooled", seeds=1):
    """The shell command that re-creates an entry from its run directory (recorded in zoo.json)."""
    args = ["python", "-m", MODULE, run_dir, name, "--config", config]
    args += ["--ema"] if ema else []
    args += ["--precise-bn", str(precise_bn)] if precise_bn else []
    args += ["--method", method] if precise_bn and method != "pooled" else []
    args += ["--seeds", str(seeds)] if seeds != 1 else []
    return shlex.join(args)


def entry_config(config):
    """`config` (a path as given on the command line) as the zoo records it: relative to the zoo's config root (the
    custom zoo's folder $BASEBN_ZOO, or the source tree root for the shipped zoo); a config outside it is refused."""
    root = config_root()
    if not is_inside(config, root):
        raise ZooError(f"--config {config!r} lies outside {root}: a zoo entry's config must be inside the zoo "
                       f"folder (or the shipped configs/); copy it there first")
    return relative_key(config, root)


def build_parser():
    """The exporter's argparse parser (tests parse the recorded commands with it)."""
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("name")
    p.add_argument("--config", required=True, help="the experiment file the run used (recorded in the entry)")
    p.add_argument("--ema", action="store_true")
    p.add_argument("--precise-bn", type=int, default=0, help="samples for precise BN before export (0 = none)")
    p.add_argument("--method", default="pooled")
    p.add_argument("--command", default="", help="the command that trained the run (recorded, followed by this "
                                                 "export's own invocation)")
    p.add_argument("--seeds", type=int, default=1, help="number of runs behind the figure (recorded)")
    return p


@cli_main
def main(argv=None):
    """CLI entry: export, then add/replace the entry in zoo.json and zoo/README.md atomically."""
    args = build_parser().parse_args(argv)
    # an index that exists must be readable: a malformed one fails here, before anything is written
    entries = list_entries() if os.path.isfile(zoo_index_path()) else []
    entry_config(args.config)  # and the config must be one the zoo can record
    metrics, path = export(args.run_dir, args.name, args.ema, args.precise_bn, args.method)
    with open(os.path.join(args.run_dir, "config.json")) as f:
        run_cfg = BaseConfig(json.load(f))
    config = entry_config(args.config)
    entry = {"name": args.name, "config": config,
             "config_sha256": config_hashes(os.path.join(config_root(), config), config_root()),
             "overrides": _overrides(run_cfg, args.config),
             "weights": os.path.basename(path), "sha256": sha256_of(path),
             "top1": round(metrics["top1"], 2), "top5": round(metrics["top5"], 2), "dataset": run_cfg.data.name,
             "ema": args.ema, "precise_bn": args.precise_bn, "seeds": args.seeds,
             "command": "; ".join(filter(None, [args.command, export_invocation(
                 args.run_dir, args.name, args.config, args.ema, args.precise_bn, args.method, args.seeds)]))}
    entries = [e for e in entries if e["name"] != args.name] + [entry]
    atomic_write_bytes(zoo_index_path(), json.dumps({"entries": entries}, indent=2).encode())
    atomic_write_bytes(os.path.join(zoo_dir(), "README.md"), render_readme(entries).encode())
    print(json.dumps(entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
