"""Training engine: trainer, hooks, checkpoints, schedules, precise BN, EMA."""
