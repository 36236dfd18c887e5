"""What an exported graph expects: the evaluation preprocessing of the config it was exported from, as metadata.

One string map (``basebn.*`` keys; lists, numbers and booleans as JSON, words as they are) goes into an ONNX
file's ``metadata_props`` and, as one JSON text, into a .mge file's serialization metadata (MegEngine's
``user_info``), so both formats carry the same values. ``preprocess_info`` builds it from the resolved config,
the test data and the weights; ``read_preprocess_info`` reads it back from a file; ``describe_preprocess`` is
the short block the CLI prints. Mean and std are on the 0-255 pixel scale, as in the config.
"""
import io
import json
import math
import os
import pickle

from megengine.core.tensor import megbrain_graph

from ..checkpoint import CheckpointError, resolve_weights
from ..models.weights import foreign_spec, zoo_name
from ..utils.fs import sha256_of
from ..zoo import get_entry
from .errors import DEPLOY_EXTRA_HINT, ExportError
from .graph import INPUT_NAME, OUTPUT_NAME

__all__ = ["METADATA_VERSION", "KEYS", "preprocess_info", "dataset_class_names", "weights_sha256",
           "encode_info", "decode_info", "read_preprocess_info", "describe_preprocess"]

METADATA_VERSION = 1
PREFIX = "basebn."
# key -> True when its value is JSON (a list, number or boolean), False when it is a plain word
KEYS = {
    "basebn.metadata_version": True, "basebn.model": False, "basebn.dataset": False, "basebn.num_classes": True,
    "basebn.class_names": True, "basebn.input_name": False, "basebn.output_name": False, "basebn.layout": False,
    "basebn.dtype": False, "basebn.input_size": True, "basebn.channels": True, "basebn.channel_order": False,
    "basebn.pixel_range": True, "basebn.mean": True, "basebn.std": True, "basebn.resize": True,
    "basebn.crop": True, "basebn.interpolation": False, "basebn.weights": False, "basebn.weights_sha256": False,
    "basebn.ema": True,
}
_SHOWN_NAMES = 12  # class names the printed block lists
_CHANNEL_ORDER = {1: "GRAY", 3: "RGB"}  # basebn decodes images as RGB (basecls's BGR weights are made RGB)


def _base_chain(dataset):
    """`dataset` and the datasets it wraps (Subset, Adapted), outermost first."""
    while dataset is not None:
        yield dataset
        dataset = getattr(dataset, "base", None)


def dataset_class_names(dataset, num_classes):
    """The label names of `dataset` (an image folder's class list, a dataset's CLASS_NAMES), or None when it
    has none or they do not name all `num_classes` outputs."""
    for ds in _base_chain(dataset):
        names = getattr(ds, "classes", None) or getattr(ds, "CLASS_NAMES", None)
        if names:
            names = [str(n) for n in names]
            return names if len(names) == num_classes else None
    return None


def _in_memory_interpolation(dataset, size):
    """The filter an in-memory dataset's images are resized with to `size` (H, W): basebn.data.Adapted's rule,
    area when shrinking the native images, bilinear when enlarging them."""
    native = next((ds for ds in _base_chain(dataset) if getattr(ds, "base", None) is None), dataset)
    _, nh, nw = native.image_shape
    return "area" if size[0] * size[1] <= nh * nw else "bilinear"


def weights_sha256(spec):
    """Hex sha256 of the file the weights `spec` reads (a zoo entry's recorded one), or None when the spec names
    no local file (basecls:NAME)."""
    name = zoo_name(spec)
    if name is not None:
        return get_entry(name).get("sha256")
    foreign = foreign_spec(spec)
    path = foreign[1] if foreign is not None else spec
    if foreign is None:
        try:
            path = resolve_weights(spec)
        except CheckpointError:
            return None
    return sha256_of(path) if os.path.isfile(path) else None


def preprocess_info(cfg, dataset, loader, image_shape, weights=None, ema=False):
    """The metadata dict (``basebn.*`` -> Python values) of a model built from `cfg`, evaluated on `dataset`
    through the eval `loader` (its resolved mean, std and per-sample transform), exported for images of
    `image_shape` (C, H, W), with weights `weights` (a spec; its EMA set with `ema`).

    Image folders are evaluated by resizing the shorter side to floor(S / crop_pct) and center-cropping S;
    in-memory datasets at their native size (or resized whole: data.image_size), i.e. resize S, crop S.
    """
    c, h, w = (int(v) for v in image_shape)
    transform = getattr(loader, "sample_transform", None)
    if transform is not None:
        resize = math.floor(min(h, w) / transform.crop_pct)
        interpolation = transform.interpolation
    else:
        resize, interpolation = min(h, w), _in_memory_interpolation(dataset, (h, w))
    info = {
        "basebn.metadata_version": METADATA_VERSION,
        "basebn.model": str(cfg.model.name),
        "basebn.dataset": str(cfg.data.name),
        "basebn.num_classes": int(cfg.num_classes),
        "basebn.class_names": dataset_class_names(dataset, int(cfg.num_classes)),
        "basebn.input_name": INPUT_NAME,
        "basebn.output_name": OUTPUT_NAME,
        "basebn.layout": "NCHW",
        "basebn.dtype": "float32",
        "basebn.input_size": [h, w],
        "basebn.channels": c,
        "basebn.channel_order": _CHANNEL_ORDER[c],
        "basebn.pixel_range": [0, 255],
        "basebn.mean": [float(m) for m in loader.mean],
        "basebn.std": [float(s) for s in loader.std],
        "basebn.resize": int(resize),
        "basebn.crop": [h, w],
        "basebn.interpolation": str(interpolation),
        "basebn.weights": None if weights is None else str(weights),
        "basebn.weights_sha256": None if weights is None else weights_sha256(weights),
        "basebn.ema": bool(ema),
    }
    return {k: v for k, v in info.items() if v is not None}


def encode_info(info):
    """The string map a file stores: JSON for lists, numbers and booleans, plain strings as they are."""
    return {k: (json.dumps(v) if KEYS.get(k, not isinstance(v, str)) else str(v)) for k, v in info.items()}


def decode_info(strings):
    """The `basebn.*` entries of a file's string map with their Python values (unknown keys stay strings);
    ExportError when a JSON value does not parse."""
    info = {}
    for k, v in strings.items():
        if not k.startswith(PREFIX):
            continue
        if KEYS.get(k):
            try:
                v = json.loads(v)
            except ValueError:
                raise ExportError(f"metadata {k}={v!r} is not JSON: the file's basebn metadata is damaged; "
                                  f"export the model again") from None
        info[k] = v
    return info


class _StringOnlyUnpickler(pickle.Unpickler):
    """Reads a pickled str (or None) and nothing that names a class: a .mge file cannot run code here."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _mge_strings(path):
    with open(path, "rb") as f:
        data = f.read()
    try:
        metadata = megbrain_graph.load_graph(io.BytesIO(data)).metadata
    except (RuntimeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"{path} is not a .mge graph MegEngine can load ({reason}): give a file written by "
                          f"python -m basebn.deploy") from None
    if not metadata.is_valid or not metadata.user_info:
        return {}
    try:
        text = _StringOnlyUnpickler(io.BytesIO(metadata.user_info)).load()
        strings = json.loads(text) if isinstance(text, str) else {}
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError):
        return {}
    return strings if isinstance(strings, dict) else {}


def _onnx_strings(path):
    try:
        import onnx
    except ImportError as exc:
        raise ExportError(f"reading ONNX metadata needs the onnx package ({exc}): {DEPLOY_EXTRA_HINT}") from None
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises DecodeError and others for a file that is not ONNX
        raise ExportError(f"{path} is not an ONNX model onnx can read ({type(exc).__name__})") from None
    return {p.key: p.value for p in model.metadata_props}


def read_preprocess_info(path):
    """The basebn metadata of the exported file `path` (.onnx or .mge) as a dict of Python values; an empty dict
    when the file carries none. ExportError for a missing or unreadable file."""
    if not os.path.isfile(path):
        raise ExportError(f"no file at {path!r}: give an exported .onnx or .mge file")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".onnx":
        strings = _onnx_strings(path)
    elif ext == ".mge":
        strings = _mge_strings(path)
    else:
        raise ExportError(f"{path!r}: an exported model is a .onnx or .mge file")
    return decode_info(strings)


def _numbers(values):
    return "[" + ", ".join(f"{float(v):g}" for v in values) + "]"


def describe_preprocess(info):
    """A few lines saying what a file with metadata `info` expects and gives."""
    h, w = info.get("basebn.input_size", ["?", "?"])
    c = info.get("basebn.channels", "?")
    names = info.get("basebn.class_names")
    lines = [
        f"expects: {info.get('basebn.channel_order', '?')}, {h}x{w}, input {info.get('basebn.input_name', '?')} "
        f"(batch, {c}, {h}, {w}) {info.get('basebn.dtype', '?')} {info.get('basebn.layout', '?')}",
        f"  resize the shorter side to {info.get('basebn.resize', '?')} ({info.get('basebn.interpolation', '?')}) "
        f"-> center-crop {'x'.join(str(v) for v in info.get('basebn.crop', ['?']))}",
        f"  pixels 0-255, (x - mean) / std: mean {_numbers(info.get('basebn.mean', []))}, "
        f"std {_numbers(info.get('basebn.std', []))}",
        f"  output {info.get('basebn.output_name', '?')} (batch, {info.get('basebn.num_classes', '?')}): raw class "
        f"scores, no softmax",
        f"  model {info.get('basebn.model', '?')} on {info.get('basebn.dataset', '?')}",
    ]
    if "basebn.weights" in info:
        sha = info.get("basebn.weights_sha256")
        ema = " (EMA)" if info.get("basebn.ema") else ""
        lines[-1] += f", weights {info['basebn.weights']}{ema}" + (f" sha256 {sha[:16]}..." if sha else "")
    if names:
        shown = ", ".join(names[:_SHOWN_NAMES]) + (f", ... ({len(names)} in all)" if len(names) > _SHOWN_NAMES else "")
        lines.insert(4, f"  classes: {shown}")
    return "\n".join(lines)
