"""RunRecord: the run's evaluation record, the one owner of "last metrics, best top-1 and its epoch".

The eval hook reports each epoch's metrics to it (:meth:`RunRecord.observe`), the checkpoint hook asks it
whether this epoch is the best (:meth:`RunRecord.is_best`), training_state saves and restores it with the
rest of the training state (keys ``metrics``, ``best_top1``, ``best_epoch`` of a training checkpoint, as
before the record existed: older checkpoints resume unchanged).
"""

__all__ = ["RunRecord"]


class RunRecord:
    """last_metrics (the last evaluation's dict; None after an epoch without one), best_top1 and best_epoch
    (None until an evaluation happened). Improvement is strict: a tie keeps the earlier epoch."""

    def __init__(self, last_metrics=None, best_top1=None, best_epoch=None):
        self.last_metrics, self.best_top1, self.best_epoch = last_metrics, best_top1, best_epoch

    def observe(self, epoch, metrics):
        """Record epoch `epoch`'s evaluation (`metrics`, a dict with "top1", or None: not evaluated)."""
        self.last_metrics = metrics
        if metrics is not None and (self.best_top1 is None or metrics["top1"] > self.best_top1):
            self.best_top1, self.best_epoch = metrics["top1"], epoch

    def is_best(self, epoch):
        """Epoch `epoch` set the best top-1 so far."""
        return self.best_epoch is not None and self.best_epoch == epoch

    def state_dict(self):
        """The checkpoint keys this record owns."""
        return {"best_top1": self.best_top1, "best_epoch": self.best_epoch, "metrics": self.last_metrics}

    def load_state_dict(self, payload):
        """Restore from a training checkpoint payload (absent keys: None)."""
        self.best_top1 = payload.get("best_top1")
        self.best_epoch = payload.get("best_epoch")
        self.last_metrics = payload.get("metrics")
