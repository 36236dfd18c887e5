"""A loader of fixed batches for driving a ClsTrainer in tests (set_epoch is a no-op)."""


class FixedBatches:
    """Iterates over ``batches``, a list of (images, labels) numpy pairs, every epoch."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        return iter(self.batches)
