"""Top-1/top-5/loss over a loader; exact across ranks (each sample counted once) and fine single-process."""
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M

from .. import distributed as dist
from ..utils.progress import progress_bar

__all__ = ["evaluate", "topk_correct", "cross_entropy_sum", "score_predictions"]


def topk_correct(logits: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 5)) -> List[int]:
    """Number of samples whose label is among the top-k logits, per k (numpy, ties broken by index).

    Args:
        logits: (N, classes).
        labels: (N,) class indices.
        ks: the k values.
    """
    order = np.argsort(-logits, axis=1, kind="stable")
    hits = order == labels[:, None]
    return [int(hits[:, :min(k, logits.shape[1])].any(axis=1).sum()) for k in ks]


def cross_entropy_sum(logits: np.ndarray, labels: np.ndarray) -> float:
    """sum over samples of -log softmax(logits)[label] (float64, numerically stable).

    Args:
        logits: (N, classes).
        labels: (N,) class indices.
    """
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1))
    return float((log_norm - z[np.arange(len(z)), np.asarray(labels)]).sum())


def _metrics(totals):
    """{'top1', 'top5', 'loss', 'images'} from this rank's [images, top1 hits, top5 hits, loss sum], summed
    over all ranks."""
    n, top1, top5, loss = dist.all_reduce_sum(totals)
    if n == 0:
        raise ValueError("evaluation saw no images: the test set is empty")
    return {"top1": 100.0 * top1 / n, "top5": 100.0 * top5 / n, "loss": loss / n, "images": int(n)}


def score_predictions(pairs: Iterable[Tuple[np.ndarray, np.ndarray]]) -> Dict[str, Any]:
    """What :func:`evaluate` reports, for predictions made elsewhere (an exported graph, test-time adaptation),
    summed over all ranks.

    Args:
        pairs: (logits, labels) numpy pairs.

    Returns:
        ``{'top1', 'top5', 'loss', 'images'}``.
    """
    totals = np.zeros(4, dtype=np.float64)  # images, top1 hits, top5 hits, loss sum
    for logits, labels in pairs:
        labels = np.asarray(labels)
        top1, top5 = topk_correct(logits, labels)
        totals += (len(labels), top1, top5, cross_entropy_sum(logits, labels))
    return _metrics(totals)


def evaluate(model: M.Module, loader: Iterable[Any], desc: str = "eval", progress: bool = False) -> Dict[str, Any]:
    """Evaluate `model` in eval mode (its modules' modes restored after), summed over all ranks.

    Args:
        model: the model.
        loader: labelled batches.
        desc: the progress bar's label.
        progress: show batches done of total (rank 0; the CLIs pass True).

    Returns:
        ``{'top1', 'top5', 'loss', 'images'}``.
    """
    modes = [(m, m.training) for m in model.modules()]  # restored one by one: keeps bn.norm_eval intact
    model.eval()
    totals = np.zeros(4, dtype=np.float64)  # images, top1 hits, top5 hits, loss sum
    try:
        for images, labels in progress_bar(loader, desc=desc, enabled=progress, rank=dist.get_rank()):
            logits = model(mge.tensor(images))
            loss = F.nn.cross_entropy(logits, mge.tensor(labels), reduction="sum")
            top1, top5 = topk_correct(logits.numpy(), np.asarray(labels))
            totals += (len(labels), top1, top5, float(loss.numpy()))
    finally:
        for m, training in modes:
            m.training = training
    return _metrics(totals)
