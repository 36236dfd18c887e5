"""Every ``BASEBN_*`` environment variable basebn reads: what it accepts and what it means, checked once per CLI.

:data:`ENV_VARS` is the one table (name -> :class:`EnvVar`). :func:`check_environment`, called at the start of every
CLI (basebn/cli.py), checks the variables that are set and raises :class:`EnvVarError`: one line naming each bad
one, its value and the accepted values (the CLIs exit 2). An empty value counts as unset, as for every reader. The
readers (Python modules, the C++ kernels) still treat a value outside the rule as unset, so a library user who never
runs a CLI gets the default, never a crash.
"""
import os
import re
import urllib.parse
from typing import Callable, NamedTuple

from .cli_args import MAX_THREADS

__all__ = ["EnvVar", "EnvVarError", "ENV_VARS", "BN_BACKENDS", "CONV_BACKENDS", "env_problems", "check_environment"]

BN_BACKENDS = ("kernel", "fallback", "auto")  # $BASEBN_BN_BACKEND (basebn/ops/bn_ops/backend.py)
CONV_BACKENDS = ("dnnl", "megengine", "auto")  # $BASEBN_CONV_BACKEND (basebn/ops/conv_ops.py)
"""The values of $BASEBN_CONV_BACKEND: oneDNN ops, MegEngine's conv, or auto."""


class EnvVarError(ValueError):
    """A ``BASEBN_*`` variable holds a value basebn does not accept."""


class EnvVar(NamedTuple):
    """A variable's rule: ``accepts(value)`` for a non-empty value, ``accepted`` in words, and its ``meaning``."""

    accepts: Callable[[str], bool]
    accepted: str
    meaning: str


def _one_of(*values):
    """Case-insensitive choice, surrounding blanks ignored (as the Python readers do)."""
    return lambda value: value.strip().lower() in values


def _whole_number(low, high):
    return lambda value: re.fullmatch(r"[0-9]+", value) is not None and low <= int(value) <= high


def _exact(*values):
    """The value itself, as readers that compare the bytes see it: no case folding, no blanks."""
    return lambda value: value in values


def _directory_or_absent(value):
    """A folder, or a path not there yet whose nearest existing ancestor is a folder (created on first use)."""
    path = os.path.abspath(value)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return os.path.isdir(path)


def _url(value):
    parts = urllib.parse.urlsplit(value)
    return parts.scheme in ("http", "https", "file") and bool(parts.netloc or parts.path)


def _any(value):
    return True


_CACHE_DIR = "a folder, or a path to create one at (not a file)"

ENV_VARS = {
    "BASEBN_BASECLS_URL": EnvVar(_url, "an http://, https:// or file:// URL",
                                 "mirror of basecls's weights, replacing its URL up to /basecls/models/"),
    "BASEBN_BN_BACKEND": EnvVar(_one_of(*BN_BACKENDS), " | ".join(BN_BACKENDS),
                                "the BN ops' path: the compiled kernels, the pure-MegEngine ops, or auto"),
    "BASEBN_CACHE": EnvVar(_directory_or_absent, _CACHE_DIR,
                           "download cache of the zoo and basecls weights, ~/.cache/basebn when unset"),
    "BASEBN_CONV_BACKEND": EnvVar(_one_of(*CONV_BACKENDS), " | ".join(CONV_BACKENDS),
                                  "the CPU convs' path: the oneDNN ops, MegEngine's, or auto"),
    "BASEBN_DATA_CACHE": EnvVar(_directory_or_absent, _CACHE_DIR, "cache of image-folder file lists"),
    "BASEBN_KERNEL_CACHE": EnvVar(_directory_or_absent, _CACHE_DIR,
                                  "build cache of the kernel library, ~/.cache/basebn/kernels when unset"),
    "BASEBN_KERNEL_CUDA": EnvVar(_exact("0", "1", "auto"), "0 | 1 | auto",
                                 "0 builds the kernel library without its CUDA part"),
    "BASEBN_KERNEL_DIR": EnvVar(os.path.isdir, "an existing folder", "the kernel sources to build the library from"),
    "BASEBN_KERNEL_PORTABLE": EnvVar(_exact("0", "1"), "0 | 1",
                                     "1 builds the kernel library without the AVX2 instructions"),
    "BASEBN_NUM_THREADS": EnvVar(_whole_number(1, MAX_THREADS), f"a whole number in [1, {MAX_THREADS}]",
                                 "threads of the kernel library's CPU ops, OpenMP's default when unset"),
    "BASEBN_ONEDNN_ROOT": EnvVar(_any, "any path", "the oneDNN install to build the conv ops with; a path without "
                                 "one builds the library without them"),
    "BASEBN_SELFCHECK": EnvVar(_one_of("0", "1"), "0 | 1", "0 skips the trainer's cached check of the kernels"),
    "BASEBN_TUNE_CPU": EnvVar(_one_of("0", "1"), "0 | 1", "0 leaves MegEngine's worker spin, glibc's malloc and "
                              "MegEngine's event-poller priority as they are (import basebn and the CLIs)"),
    "BASEBN_ZOO": EnvVar(os.path.isdir, "an existing folder", "the model zoo folder (holds zoo.json)"),
    # read by the C++ kernels, for tests and benchmarks
    "BASEBN_BN_TRAIN_PLAN": EnvVar(_exact("channels", "rows"), "channels | rows",
                                   "forces the fused training BN ops' thread plan"),
    "BASEBN_CONV_DEPTHWISE": EnvVar(_exact("0", "1"), "0 | 1",
                                    "0 sends depthwise convs to oneDNN instead of basebn's NCHW kernels"),
    "BASEBN_CONV_PLAIN_1X1": EnvVar(_exact("0", "all"), "0 | all",
                                    "0 keeps every 1x1 conv on oneDNN's blocked kernels, all sends each to NCHW"),
}


def env_problems(environ=None):
    """``[(name, value, EnvVar)]`` of the set ``BASEBN_*`` variables whose value the table refuses."""
    environ = os.environ if environ is None else environ
    return [(name, environ[name], var) for name, var in ENV_VARS.items()
            if environ.get(name) and not var.accepts(environ[name])]


def check_environment(environ=None):
    """Raise :class:`EnvVarError` (one line, every bad variable) unless each set ``BASEBN_*`` variable is accepted."""
    bad = env_problems(environ)
    if bad:
        raise EnvVarError("; ".join(f"environment variable {name}={value!r} ({var.meaning}): expected {var.accepted}"
                                    for name, value, var in bad) + " (change or unset it)")
