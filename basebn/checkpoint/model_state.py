"""Model state <-> numpy dicts: model_state (portable, device-free) and load_model_state (says what does not fit).

Not to be confused with basebn.engine.training_state (what a training checkpoint holds: model, optimizer,
EMA, progress, ...): this module is the model-weights part only, shared by checkpoints, weights and the zoo.
"""
import numpy as np

from .errors import CheckpointError

__all__ = ["model_state", "load_model_state"]


def model_state(module):
    """state_dict as numpy arrays."""
    return {k: np.asarray(v) for k, v in module.state_dict().items()}


def load_model_state(module, state, source="checkpoint", strict=True):
    """Load numpy `state` into `module`, failing with the list of mismatched keys and shapes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: checkpoint {tuple(np.shape(state[k]))} vs model {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(state)) if tuple(np.shape(state[k])) != tuple(own[k].shape)]
    if shapes or (strict and (missing or unexpected)):
        lines = []
        if missing:
            lines.append(f"missing in checkpoint ({len(missing)}): {', '.join(missing[:20])}")
        if unexpected:
            lines.append(f"not in model ({len(unexpected)}): {', '.join(unexpected[:20])}")
        if shapes:
            lines.append(f"shape mismatch ({len(shapes)}): " + "; ".join(shapes[:20]))
        raise CheckpointError(
            f"{source} does not fit this model (different architecture, num_classes or norm?):\n  "
            + "\n  ".join(lines)
        )
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
