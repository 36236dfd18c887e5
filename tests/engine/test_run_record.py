"""RunRecord, the one owner of last metrics / best top-1 / best epoch: strict improvement, None epochs keep the
best, and the checkpoint keys round-trip (older payloads without some keys give None)."""
from basebn.engine.run_record import RunRecord


def test_best_moves_only_on_strict_improvement():
    r = RunRecord()
    assert not r.is_best(1)
    r.observe(1, {"top1": 50.0})
    assert (r.best_top1, r.best_epoch, r.is_best(1)) == (50.0, 1, True)
    r.observe(2, {"top1": 50.0})  # a tie keeps the earlier epoch
    assert (r.best_top1, r.best_epoch, r.is_best(2)) == (50.0, 1, False)
    r.observe(3, None)  # no evaluation this epoch
    assert (r.last_metrics, r.best_epoch, r.is_best(3)) == (None, 1, False)
    r.observe(4, {"top1": 61.5})
    assert (r.best_top1, r.best_epoch, r.is_best(4), r.last_metrics) == (61.5, 4, True, {"top1": 61.5})


def test_checkpoint_keys_round_trip_and_old_payloads():
    r = RunRecord()
    r.observe(2, {"epoch": 2, "top1": 70.0})
    payload = {"epoch": 2, **r.state_dict()}
    assert payload == {"epoch": 2, "best_top1": 70.0, "best_epoch": 2, "metrics": {"epoch": 2, "top1": 70.0}}
    back = RunRecord()
    back.load_state_dict(payload)
    assert (back.best_top1, back.best_epoch, back.last_metrics) == (70.0, 2, {"epoch": 2, "top1": 70.0})
    old = RunRecord(last_metrics={"top1": 1.0}, best_top1=1.0, best_epoch=1)
    old.load_state_dict({"epoch": 3, "best_top1": 40.0, "best_epoch": 3})  # a payload without "metrics"
    assert (old.best_top1, old.best_epoch, old.last_metrics) == (40.0, 3, None)
