"""Value rules for every config key, checked when a config is loaded (before anything runs).

RULES maps each flat key of the defaults to a rule; a test checks that no key is left without one.
A rule is a callable returning None when the value is fine, else what the value must be.
"""
import difflib
import math
import numbers
import os

from ..data import DATASET_ALIASES, DATASET_NAMES, DataError
from ..data.augment import ERASE_MODES, INTERPOLATIONS, TRAIN_CROPS, parse_policy
from ..layers.norm import NORM_KINDS
from ..models import RESNET_FAMILIES, ZERO_INIT_FAMILIES, list_models, model_info
from ..utils.cli_args import MAX_BATCH, MAX_CLASSES, MAX_IMAGE_SIZE, MAX_SAMPLES, MAX_WORKERS
from .defaults import DEFAULTS

__all__ = ["RULES", "check_values", "CheckFailed"]


class CheckFailed(ValueError):
    """Raised by check_values with the key, the value and what it must be."""


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def integer(low=None, inf_ok=False):
    """Rule: an int (bools excluded) >= low; inf too when inf_ok."""
    def rule(v):
        if inf_ok and _is_real(v) and v == math.inf:
            return None
        if not _is_int(v) or (low is not None and v < low):
            return f"an integer >= {low}" + (" or inf" if inf_ok else "") if low is not None else "an integer"
        return None
    return rule


def real(low=-math.inf, high=math.inf, low_open=False, high_open=False):
    """A finite number in the interval (brackets in the message say which ends are included)."""
    def rule(v):
        ok = _is_real(v) and math.isfinite(v) and (v > low if low_open else v >= low) and (
            v < high if high_open else v <= high)
        if ok:
            return None
        if high == math.inf:
            return f"a finite number {'>' if low_open else '>='} {low:g}"
        lo, hi = ("(" if low_open else "[") + f"{low:g}", f"{high:g}" + (")" if high_open else "]")
        return f"a finite number in {lo}, {hi}"
    return rule


def choice(*values):
    """Rule: one of `values`."""
    def rule(v):
        return None if v in values else "one of " + ", ".join(repr(x) for x in values)
    return rule


def optional(inner):
    """Rule: None, or what `inner` accepts."""
    def rule(v):
        if v is None:
            return None
        msg = inner(v)
        return None if msg is None else f"None or {msg}"
    return rule


def boolean(v):
    """Rule: True or False (not 0/1)."""
    return None if isinstance(v, bool) else "True or False"


def text(v):
    """Rule: a non-empty string."""
    return None if isinstance(v, str) and v else "a non-empty string"


def numbers_list(item_rule, length=None):
    """Rule: a list/tuple (of `length` items, when given) whose items pass `item_rule`."""
    def rule(v):
        if not isinstance(v, (list, tuple)) or (length is not None and len(v) != length) or any(
                item_rule(x) is not None for x in v):
            n = f"{length} " if length is not None else ""
            return f"a list of {n}values, each {item_rule(object())}"
        return None
    return rule


def every_n_epochs(v):
    """inf = never, -1 = after the last epoch only, else a positive whole number of epochs."""
    if _is_real(v) and (v == math.inf or v == -1 or (v >= 1 and float(v).is_integer())):
        return None
    return "an integer >= 1, -1 (after the last epoch only) or inf (off)"


def _dataset_name(v):
    ok = isinstance(v, str) and (v.lower() in DATASET_NAMES or v.lower() in DATASET_ALIASES)
    return None if ok else "one of " + ", ".join(DATASET_NAMES)


def _class_names(v):
    """A non-empty list of distinct, non-empty strings (image-folder class names in label order)."""
    ok = isinstance(v, (list, tuple)) and v and all(isinstance(c, str) and c for c in v) and len(set(v)) == len(v)
    return None if ok else "a list of distinct class folder names"


def _prefetch(v):
    """Batches ahead: an integer >= 0, or True/False (read as 2/0)."""
    return None if isinstance(v, bool) or (_is_int(v) and v >= 0) else "an integer >= 0 (or True/False)"


def _color_jitter(v):
    ok = v is None or (_is_real(v) and math.isfinite(v) and v >= 0) or (
        isinstance(v, (list, tuple)) and len(v) == 3 and all(_is_real(x) and math.isfinite(x) and x >= 0 for x in v))
    return None if ok else "None, a number >= 0 or a list of 3 numbers >= 0 (brightness, contrast, saturation)"


def _augment_policy(v):
    if v is None:
        return None
    try:
        parse_policy(v)
    except DataError as e:
        return f"None or a valid policy string ({e})"
    return None


def _model_name(v):
    names = list_models()
    if v in names:
        return None
    close = difflib.get_close_matches(str(v), names, n=4, cutoff=0.6)
    hint = f" (closest: {', '.join(close)})" if close else f" (e.g. {', '.join(names[:6])})"
    return f"one of the {len(names)} names of basebn.models.list_models(){hint}"


RULES = {
    "batch_size": integer(1),
    "test_batch_size": optional(integer(1)),
    "num_classes": integer(2),
    "output_dir": optional(text),
    "seed": integer(0),
    "data.name": _dataset_name,
    "data.root": optional(text),
    "data.image_size": optional(integer(8)),
    "data.channels": optional(choice(1, 3)),
    "data.classes": optional(_class_names),
    "data.pad": optional(integer(0)),
    "data.hflip": optional(boolean),
    "data.mean": optional(numbers_list(real())),
    "data.std": optional(numbers_list(real(0, low_open=True))),
    "data.train_crop": optional(choice(*TRAIN_CROPS)),
    "data.crop_pct": real(0, 1, low_open=True),
    "data.interpolation": choice(*INTERPOLATIONS),
    "data.rrc_scale": numbers_list(real(0, 1, low_open=True), length=2),
    "data.rrc_ratio": numbers_list(real(0, low_open=True), length=2),
    "data.color_jitter": _color_jitter,
    "data.lighting": real(0),
    "data.auto_augment": _augment_policy,
    "data.random_erasing.prob": real(0, 1),
    "data.random_erasing.area": numbers_list(real(0, 1, low_open=True), length=2),
    "data.random_erasing.aspect": real(0, 1, low_open=True),
    "data.random_erasing.mode": choice(*ERASE_MODES),
    "data.random_erasing.count": integer(1),
    "data.mixup": real(0),
    "data.cutmix": real(0),
    "data.mix_prob": real(0, 1),
    "data.mix_switch_prob": real(0, 1),
    "data.train_size": integer(1),
    "data.test_size": integer(1),
    "data.max_train_samples": optional(integer(1)),
    "data.max_test_samples": optional(integer(1)),
    "data.prefetch": optional(_prefetch),
    "data.num_workers": optional(integer(0)),
    "data.skip_bad_images": boolean,
    "data.repeated_aug": integer(1),
    "data.classes_per_batch": integer(0),
    "data.examples_per_class": optional(integer(0)),
    "model.name": _model_name,
    "model.stem": choice("small", "imagenet"),
    "model.stem_stride": integer(1),
    "model.base_width": optional(integer(1)),
    "model.norm": choice(*NORM_KINDS),
    "model.weights": optional(text),
    "model.zero_init_residual": optional(boolean),
    "loss.label_smooth": real(0, 1, high_open=True),
    "loss.name": choice("ce", "bce"),
    "solver.optimizer": choice("sgd", "adamw"),
    "solver.basic_lr": real(0, low_open=True),
    "solver.momentum": real(0, 1, high_open=True),
    "solver.weight_decay": real(0),
    "solver.nesterov": boolean,
    "solver.betas": numbers_list(real(0, 1, high_open=True), length=2),
    "solver.weight_decay_exclude_norm_bias": boolean,
    "solver.max_epoch": integer(1),
    "solver.warmup_epochs": real(0),
    "solver.warmup_factor": real(0, 1),
    "solver.lr_schedule": choice("cosine", "step", "linear"),
    "solver.lr_decay_steps": numbers_list(real(0)),
    "solver.lr_decay_factor": real(0, 1, low_open=True),
    "solver.lr_min_factor": real(0, 1),
    "solver.grad_clip.name": choice(None, "norm", "value"),
    "solver.grad_clip.max_norm": lambda v: None if _is_real(v) and v > 0 else "a number > 0 (inf = no clipping)",
    "solver.grad_clip.lower": lambda v: None if _is_real(v) and not math.isnan(v) else "a number (-inf allowed)",
    "solver.grad_clip.upper": lambda v: None if _is_real(v) and not math.isnan(v) else "a number (inf allowed)",
    "solver.accumulation_steps": integer(1),
    "model_ema.enabled": boolean,
    "model_ema.momentum": real(0, 1),
    "model_ema.update_period": integer(1),
    "model_ema.start_epoch": integer(0),
    "model_ema.alpha": optional(real(0, low_open=True)),
    "model_ema.copy_buffers": boolean,
    "bn.momentum": optional(real(0, 1)),
    "bn.eps": optional(real(0, low_open=True)),
    "bn.precise_every_n_epoch": every_n_epochs,
    "bn.num_samples_precise": integer(1),
    "bn.precise_batch_size": optional(integer(1)),
    "bn.precise_method": choice("pooled", "batch_average"),
    "bn.norm_eval": boolean,
    "bn.efficient_conv_bn_eval": boolean,
    "bn.norm_batch_size": optional(integer(1)),
    "bn.renorm.r_max": real(1),
    "bn.renorm.d_max": real(0),
    "bn.renorm.warmup_epochs": real(0),
    "bn.renorm.ramp_epochs": real(0),
    "bn.accumulation_aware": boolean,
    "bn.sync_buffers": choice("mean", "broadcast", "off"),
    "bn.freeze_last_epochs": integer(0),
    "amp.enabled": boolean,
    "amp.dynamic_scale": boolean,
    "trace": boolean,
    "log_every_n_iter": integer(1),
    "log.tensorboard": boolean,
    "save_every_n_epoch": integer(1, inf_ok=True),
    "eval_every_n_epoch": integer(1, inf_ok=True),
}


def _cross_checks(flat):
    """Rules that involve two keys: (ok, message)."""
    clip = flat["solver.grad_clip.lower"] < flat["solver.grad_clip.upper"]
    yield clip, "solver.grad_clip.lower must be < solver.grad_clip.upper"
    for key in ("data.mean", "data.std"):
        v, ch = flat[key], flat["data.channels"]
        if v is not None and ch is not None:
            yield len(v) in (1, ch), f"{key} has {len(v)} values for data.channels={ch}; give 1 or {ch}"
    for key in ("data.rrc_scale", "data.rrc_ratio", "data.random_erasing.area"):
        low, high = flat[key]
        yield low <= high, f"{key} must be (low, high) with low <= high, got {tuple(flat[key])}"
    steps = list(flat["solver.lr_decay_steps"])
    yield steps == sorted(steps), "solver.lr_decay_steps must be in increasing order"
    yield from _class_batch_checks(flat)
    yield from _bn_training_checks(flat)


def _class_batch_checks(flat):
    """data.classes_per_batch / data.examples_per_class against num_classes, batch_size and repeated_aug (the
    training split's own classes are checked when its loader is built): (ok, message)."""
    k, m = flat.get("data.classes_per_batch", 0), flat.get("data.examples_per_class")
    if not k:
        yield not m, (f"data.examples_per_class={m} applies to class batches only, and data.classes_per_batch is 0 "
                      f"(off): set data.classes_per_batch, or data.examples_per_class=None")
        return
    classes, batch = flat["num_classes"], flat["batch_size"]
    yield k <= classes, (f"data.classes_per_batch={k} is more than the num_classes={classes} classes a batch can hold; "
                         f"set it to at most {classes}")
    yield k <= batch, (f"data.classes_per_batch={k} is more than batch_size={batch} (a batch holds at least one "
                       f"example of each of its classes); set it to at most {batch}")
    if not m:
        yield batch % k == 0, (f"data.classes_per_batch={k} must divide batch_size={batch} (a batch holds {k} "
                               f"classes, batch_size / {k} examples of each); choose a divisor of {batch}")
    else:
        yield batch % (k * m) == 0, (
            f"data.classes_per_batch={k} x data.examples_per_class={m} = {k * m} must divide batch_size={batch} "
            f"(a batch holds {k} classes, batch_size / {k} examples of each, in groups of {m}); change one of "
            f"the three")
    ra = flat.get("data.repeated_aug", 1)
    yield ra == 1, (f"data.classes_per_batch={k} cannot be combined with data.repeated_aug={ra} (repeated "
                    f"augmentation deals each image's copies over the ranks, class batches choose each batch's "
                    f"classes): set data.repeated_aug=1 or data.classes_per_batch=0")


def _bn_training_checks(flat):
    """The bn.* training keys against batch_size, model.norm and solver.max_epoch: (ok, message)."""
    size, batch = flat.get("bn.norm_batch_size"), flat["batch_size"]
    if size is not None:
        yield batch % size == 0, (f"bn.norm_batch_size={size} must divide batch_size={batch}: choose a divisor "
                                  f"of {batch} or None")
        yield flat["model.norm"] == "BN", (f"bn.norm_batch_size applies to model.norm='BN' only, got "
                                           f"model.norm={flat['model.norm']!r}: set bn.norm_batch_size=None")
    if flat.get("trace"):
        yield size is None and flat["model.norm"] not in ("BRN", "SyncBRN"), (
            "trace=True runs MegEngine's own BN op: it cannot run bn.norm_batch_size or model.norm='BRN'/'SyncBRN'; "
            "set trace=False")
    freeze, epochs = flat.get("bn.freeze_last_epochs", 0), flat["solver.max_epoch"]
    yield freeze <= epochs, (f"bn.freeze_last_epochs={freeze} must be at most solver.max_epoch={epochs}")


def _model_family_checks(flat):
    """Model keys that only some families take, against model.name's family: (ok, message). Run after the
    per-key rules, so model.name is a known name."""
    name = flat["model.name"]
    family = model_info(name)["family"]
    if family not in RESNET_FAMILIES:
        for key in ("model.stem", "model.stem_stride", "model.base_width"):
            default = DEFAULTS["model"][key.split(".")[1]]
            yield flat[key] == default, (
                f"config key {key!r} applies to basebn's ResNets only (families {', '.join(RESNET_FAMILIES)}); "
                f"model.name={name!r} is family {family!r}: remove {key}={flat[key]!r} (default {default!r})")
    elif flat["model.stem"] != "small":
        yield flat["model.stem_stride"] == 1, (
            f"config key 'model.stem_stride' applies to model.stem='small' only; model.stem is "
            f"{flat['model.stem']!r}: remove model.stem_stride={flat['model.stem_stride']!r}")
    yield flat["model.zero_init_residual"] is not True or family in ZERO_INIT_FAMILIES, (
        f"config key 'model.zero_init_residual' is True but model.name={name!r} (family {family!r}) has no "
        f"residual block ending in a norm; set it to None or False")


# ---------------------------------------------------------------------------------------- upper bounds
# RULES say what a value must be; these say how large a number may plausibly be (a mistyped exponent fails here,
# in one line, not as a MemoryError or a thousand forked workers later). The bounds shared with the CLIs'
# arguments come from basebn.utils.cli_args.
UPPER_BOUNDS = {
    "batch_size": MAX_BATCH,
    "test_batch_size": MAX_BATCH,
    "num_classes": MAX_CLASSES,
    "seed": 2 ** 64 - 1,  # MegEngine's generator takes an unsigned 64-bit seed
    "data.image_size": MAX_IMAGE_SIZE,
    "data.pad": MAX_IMAGE_SIZE,
    "data.train_size": 10_000_000,
    "data.test_size": 10_000_000,
    "data.prefetch": 64,
    "data.num_workers": MAX_WORKERS,
    "data.repeated_aug": 64,
    "data.random_erasing.count": 100,
    "model.stem_stride": 8,
    "model.base_width": 4096,
    "solver.max_epoch": 100_000,
    "solver.accumulation_steps": 65536,
    "bn.num_samples_precise": MAX_SAMPLES,
    "bn.precise_batch_size": MAX_BATCH,
}
_SYNTHETIC_BYTES_PER_PIXEL = 16  # float32 noise, image and temporaries while synthetic shapes are drawn


def _physical_memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _range_checks(flat):
    """Numbers within their plausible upper bound, and a synthetic set that fits in memory: (ok, message)."""
    for key, high in UPPER_BOUNDS.items():
        v = flat.get(key)
        if _is_int(v):
            yield v <= high, f"config key {key!r} must be at most {high}, got {v}"
    if str(flat.get("data.name")).lower() == "synthetic":
        size = flat.get("data.image_size") or 16
        images = flat["data.train_size"] + flat["data.test_size"]
        need, have = images * size * size * _SYNTHETIC_BYTES_PER_PIXEL, _physical_memory_bytes()
        yield have is None or need <= have, (
            f"the synthetic set of data.train_size + data.test_size = {images} images of {size}x{size} px needs "
            f"about {need / 2 ** 30:.1f} GiB to draw, more than this machine's {(have or 0) / 2 ** 30:.1f} GiB: "
            f"lower data.train_size, data.test_size or data.image_size")


def check_values(flat):
    """Raise CheckFailed for the first value of the flat config `flat` that breaks its rule."""
    for key, rule in RULES.items():
        if key in flat:
            msg = rule(flat[key])
            if msg is not None:
                raise CheckFailed(f"config key {key!r} must be {msg}, got {flat[key]!r}")
    for ok, msg in _range_checks(flat):
        if not ok:
            raise CheckFailed(msg)
    for ok, msg in _cross_checks(flat):
        if not ok:
            raise CheckFailed(msg)
    for ok, msg in _model_family_checks(flat):
        if not ok:
            raise CheckFailed(msg)
