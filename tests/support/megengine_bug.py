"""MegEngine 1.13's CPU backward now and then returns wrong (1, C, 1, 1) gradients (eval-mode BN weight/bias,
a broadcast affine after a conv; no basebn code involved). Wrong results differ from run to run while the true
one repeats, so a reference is the first result two runs agree on (not necessarily consecutive ones)."""


def first_repeated(run_once, agree, max_runs):
    """The first result of run_once() that agrees with an earlier one, or None after max_runs runs."""
    runs = []
    for _ in range(max_runs):
        run = run_once()
        if any(agree(run, earlier) for earlier in runs):
            return run
        runs.append(run)
    return None
