"""Checkpoint and weights files: one .npz container (no pickle, checksummed), legacy .pkl read safely,
the run directory's checkpoint files, and loading numpy state into a model.

Depends only on basebn.utils (the zoo and the engine build on it, never the reverse).
"""
from .errors import CheckpointError
from .format import read_container, write_container
from .legacy import load_legacy_checkpoint
from .payload import (FORMAT, load_checkpoint, read_npz_weights, read_recorded_config, save_checkpoint,
                      save_npz_weights)
from .run_files import (BEST, FINAL, LATEST, complete_run, epoch_file, epoch_files, final_payload, find_checkpoint,
                        load_latest, resolve_weights, write_epoch_end, write_final)
from .model_state import load_model_state, member_fit, model_state

__all__ = ["CheckpointError", "read_container", "write_container", "load_legacy_checkpoint", "FORMAT",
           "save_checkpoint", "load_checkpoint", "read_recorded_config", "save_npz_weights", "read_npz_weights",
           "LATEST", "BEST", "FINAL", "epoch_file", "epoch_files", "find_checkpoint", "resolve_weights", "load_latest",
           "final_payload", "write_epoch_end", "write_final", "complete_run", "model_state", "load_model_state",
           "member_fit"]
