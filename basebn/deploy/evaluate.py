"""Top-1/top-5/loss of an exported model over a loader: what basebn.test reports for the eager model."""
from .. import distributed as dist
from ..engine.evaluate import score_predictions
from ..utils.progress import progress_bar

__all__ = ["evaluate_exported"]


def evaluate_exported(run, loader, desc="test"):
    """Evaluate `run` (images -> logits, e.g. an ExportedModel) on `loader`: {'top1','top5','loss','images'}."""
    batches = progress_bar(loader, desc=desc, total=len(loader), enabled=dist.is_main_process())
    return score_predictions((run(images), labels) for images, labels in batches)
