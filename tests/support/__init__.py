"""Helpers shared by the tests (not tests themselves). ROOT is the repository root."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
