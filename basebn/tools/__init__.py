"""Command-line tools (plotting)."""
