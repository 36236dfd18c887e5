"""Top-1/top-5/loss of an exported model over a loader: what basebn.test reports for the eager model."""
import numpy as np

from .. import distributed as dist
from ..engine.evaluate import topk_correct
from ..utils.progress import progress_bar

__all__ = ["cross_entropy_sum", "evaluate_exported"]


def cross_entropy_sum(logits, labels):
    """sum over samples of -log softmax(logits)[label] (float64, numerically stable)."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1))
    return float((log_norm - z[np.arange(len(z)), np.asarray(labels)]).sum())


def evaluate_exported(run, loader, desc="test"):
    """Evaluate `run` (images -> logits, e.g. an ExportedModel) on `loader`: {'top1','top5','loss','images'}."""
    totals = np.zeros(4, dtype=np.float64)  # images, top1 hits, top5 hits, loss sum
    for images, labels in progress_bar(loader, desc=desc, total=len(loader), enabled=dist.is_main_process()):
        labels = np.asarray(labels)
        logits = run(images)
        top1, top5 = topk_correct(logits, labels)
        totals += (len(labels), top1, top5, cross_entropy_sum(logits, labels))
    n, top1, top5, loss = dist.all_reduce_sum(totals)
    if n == 0:
        raise ValueError("evaluation saw no images: the test set is empty")
    return {"top1": 100.0 * top1 / n, "top5": 100.0 * top5 / n, "loss": loss / n, "images": int(n)}
