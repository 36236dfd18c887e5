"""One training step of a classifier for the fused-vs-unfused tests: loss, parameter gradients, BN running
statistics (numpy). Dropout and drop path draw the same masks for every model (MegEngine's RNG seeded first);
MegEngine accumulates gradients, so a model stepped twice needs ``p.grad = None`` in between."""
import megengine as mge
import megengine.functional as F
from megengine.autodiff import GradManager


def train_step(model, x, labels):
    """``(loss, {name: gradient}, {name: running statistic})`` of one forward/backward in train mode."""
    model.train()
    mge.random.seed(0)
    gm = GradManager().attach(model.parameters())
    with gm:
        loss = F.nn.cross_entropy(model(mge.tensor(x)), mge.tensor(labels))
        gm.backward(loss)
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    stats = {k: v for k, v in model.state_dict().items() if k.endswith(("running_mean", "running_var"))}
    return float(loss.numpy()), grads, stats
