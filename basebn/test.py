"""python -m basebn.test CONFIG.py -w WEIGHTS [--ema] [--backend B] [--threads N] [--json] [KEY=VALUE ...]
   python -m basebn.test RUN_DIR|RUN_DIR/config.json [-w WEIGHTS] [--ema] [--json] [KEY=VALUE ...]
   python -m basebn.test zoo:NAME [--ema] [--backend B] [--json]
   python -m basebn.test ... --adapt none|bn_batch|adabn|tent [--episodic] [--adapt-lr LR] [--adapt-steps N]
                             [--adapt-optimizer adam|sgd] [--save-adapted OUT.npz [--force]]

WEIGHTS is a checkpoint file (.npz, or a legacy .pkl), a run directory (its final weights), zoo:NAME,
basecls:PATH, timm:PATH (.safetensors), or an exported model (.mge / .onnx, from python -m basebn.deploy).
--backend eager (default) runs the model in MegEngine; megengine / lite / onnxruntime export it on the fly
to a temporary .mge / .onnx file (or take the -w file as is) and run that file in GraphInference /
MegEngine Lite / onnxruntime. A run directory (or its config.json) as CONFIG evaluates with the run's resolved
config, and without -w with the run's final weights (else its latest).
"""
import json
import os
import sys
import tempfile

import megengine as mge
from loguru import logger

from . import distributed as dist
from .cli import cli_main
from .config import ConfigError, run_dir_of
from .deploy import BACKENDS, export_mge, export_onnx, load_exported
from .deploy.evaluate import evaluate_exported
from .engine.adapt_eval import (AdaptedSaveError, AdaptOptions, add_adapt_arguments, adapt_options_from_args,
                                check_adapt_options, evaluate_with_adaptation)
from .engine.build import build_data, example_input, load_trained, resolve_config, test_batch_size
from .engine.evaluate import evaluate
from .engine.logging import setup_logging
from .layers import enable_efficient_conv_bn_eval
from .utils.cli_args import MAX_THREADS, OneLineArgumentParser, bounded_int

__all__ = ["test", "main", "is_exported_file"]

_EXPORTERS = {".mge": export_mge, ".onnx": export_onnx}


def is_exported_file(spec):
    """`spec` names an exported model file (.mge or .onnx) rather than weights."""
    return isinstance(spec, str) and os.path.splitext(spec)[1].lower() in _EXPORTERS


def _evaluate_exported_file(path, ds, loader, num_classes, backend, threads):
    exported = load_exported(path, backend, threads)
    exported.check_data(ds.image_shape, num_classes)
    return evaluate_exported(exported, loader, desc=f"test ({backend or 'exported'})")


def test(cfg, weights, ema=False, backend="eager", threads=None, adapt=None):
    """Evaluate `weights` on the test split of cfg's dataset; returns {'top1', 'top5', 'loss', 'images'}.

    `backend` other than "eager" exports the model to a temporary file and evaluates that file; `weights`
    may also be an exported .mge/.onnx file itself (then `ema` must be False). `adapt` (an AdaptOptions)
    selects test-time BN adaptation (basebn.engine.adapt_eval; eager backend only); a ``--save-adapted`` file
    that cannot be written at the end raises AdaptedSaveError, its metrics attached.
    """
    adapt = adapt or AdaptOptions()
    check_adapt_options(adapt, backend=backend, exported=is_exported_file(weights))
    if is_exported_file(weights):
        if ema:
            raise ConfigError(f"--ema selects weights in a checkpoint; {weights!r} is an exported model: drop --ema")
        dist.init("auto")
        ds, loader = build_data(cfg, train=False)
        return _evaluate_exported_file(weights, ds, loader, cfg.num_classes, None if backend == "eager" else backend,
                                       threads)
    model, ds, loader = load_trained(cfg, weights, ema=ema)
    if adapt.active:
        return evaluate_with_adaptation(model, loader, test_batch_size(cfg), adapt, source=weights)
    if backend != "eager":
        ext = BACKENDS[backend]
        with tempfile.TemporaryDirectory(prefix="basebn-test-") as tmp:
            path = os.path.join(tmp, "model" + ext)
            _EXPORTERS[ext](model, path, example_input(ds).shape)
            return _evaluate_exported_file(path, ds, loader, cfg.num_classes, backend, threads)
    if cfg.bn.efficient_conv_bn_eval:
        enable_efficient_conv_bn_eval(model, example_input=mge.tensor(example_input(ds)))
    return evaluate(model, loader, desc="test", progress=True)


def _parse(argv):
    p = OneLineArgumentParser(prog="python -m basebn.test", description=__doc__.split("\n")[0])
    p.add_argument("config", metavar="CONFIG",
                   help="experiment file, a run directory or its config.json (the run's config; its weights "
                        "without -w), or zoo:NAME to evaluate a zoo entry with its own config")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (e.g. data.root=...)")
    p.add_argument("-w", "--weights", help="checkpoint file, run directory, zoo:NAME or exported .mge/.onnx file")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--backend", default="eager", choices=["eager", *BACKENDS],
                   help="eager MegEngine (default), or an exported graph in megengine (GraphInference), "
                        "lite (MegEngine Lite) or onnxruntime")
    p.add_argument("--threads", type=bounded_int(1, MAX_THREADS),
                   help="runtime threads for an exported graph (default: the runtime's own)")
    p.add_argument("--json", action="store_true", help='print a last line {"top1":..,"top5":..,"loss":..,"images":..}')
    add_adapt_arguments(p)
    return p.parse_intermixed_args(argv)


@cli_main
def main(argv=None):
    """CLI entry: parse argv, evaluate, print the metrics (and a JSON line with --json); returns the exit code."""
    args = _parse(argv)
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {args.threads}")
    setup_logging(None)
    cfg, weights = resolve_config(args.config, args.overrides, args.weights or run_dir_of(args.config))
    try:
        m, save_error = test(cfg, weights, ema=args.ema, backend=args.backend, threads=args.threads,
                             adapt=adapt_options_from_args(args)), None
    except AdaptedSaveError as exc:  # the metrics are still reported, then the one line, exit 1
        m, save_error = exc.metrics, exc
    via = f" via {args.backend}" if args.backend != "eager" else " (exported)" if is_exported_file(weights) else ""
    via += f" adapted by {args.adapt}" if args.adapt != "none" else ""
    logger.info(f"{weights}{' (EMA)' if args.ema else ''}{via}: top1 {m['top1']:.2f} top5 {m['top5']:.2f} "
                f"loss {m['loss']:.4f} on {m['images']} images")
    if args.json and dist.is_main_process():
        print(json.dumps(m))
    if save_error is not None:
        print(f"error: {save_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
