"""Normalisation layers and BN ops. Each feature lives in its own module; this file only re-exports."""
