"""Fixtures of the op tests: ``backend`` runs a test on each BN path (tests/support/bn_ops.py)."""
from tests.support.bn_ops import backend  # noqa: F401 (a fixture)
