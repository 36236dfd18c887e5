"""basebn: a MegEngine image-classification trainer that gets BatchNorm right and fast.

``import basebn`` gives its subpackages (``basebn.models``, ``basebn.layers``, ``basebn.engine.ema``, ...; the CLIs
``basebn.train``, ``basebn.test`` and ``basebn.tools.*`` are imported by name) and prepares the process as the CLIs
do (:func:`.utils.cpu_runtime.prepare_process`: MegEngine's CUDA probe silenced; without CUDA its worker spin
capped, freed memory kept mapped, its event poller at the lowest priority; ``BASEBN_TUNE_CPU=0`` leaves the process
alone). :func:`setup_cpu_training` is the one call a CPU training loop of its own adds. docs/library.md.
"""
import megengine as _mge

from .utils import cpu_runtime as _cpu_runtime

__version__ = "0.1.0"

_cpu_runtime.prepare_process()  # before any tensor: MegEngine reads its worker spin at its first operation

# the subpackages; not the CLI modules (python -m would find them imported already)
from . import checkpoint, config, data, deploy, distributed, engine, layers, models, utils, zoo  # noqa: E402
# basebn.engine.adapt, .ema and .optimizer with the package (its __init__ imports none)
from .engine import adapt as _adapt, ema as _ema, optimizer as _optimizer  # noqa: E402,F401

__all__ = ["checkpoint", "config", "data", "deploy", "distributed", "engine", "layers", "models", "utils", "zoo",
           "setup_cpu_training"]


def setup_cpu_training():
    """Run MegEngine's CPU kernels on the thread that issues them, as basebn.train does: the one call a CPU training
    loop of its own makes, before its first tensor (:func:`.utils.cpu_runtime.use_inline_cpu_device`; the OpenMP
    worker spins between ops unless this is one of several MPI ranks). Not in a process that dumps a traced graph
    (MegEngine cannot dump one traced on that device); with CUDA nothing changes. Returns MegEngine's default
    device now."""
    if _mge.is_cuda_available():
        return _mge.get_default_device()
    return _cpu_runtime.use_inline_cpu_device(omp_spin=not distributed.is_multiprocess_job())
