"""Command-line parsing shared by basebn's CLIs: a bad argument is one line (exit 2), numbers are range-checked.

OneLineArgumentParser prints `error: ... (see PROG --help)` instead of argparse's usage block, and says
`missing CONFIG` (not "overrides are required") when only the config is left out. bounded_int and
bounded_float are argparse `type=`s that accept whole numbers / finite numbers in [low, high] (never nan or
inf: every float argument of a basebn CLI uses bounded_float); the MAX_* bounds are shared with the config
checks so a number means the same on the command line and in a config.
"""
import argparse
import math

__all__ = ["OneLineArgumentParser", "bounded_int", "bounded_float", "MAX_BATCH", "MAX_CLASSES", "MAX_IMAGE_SIZE",
           "MAX_THREADS", "MAX_WORKERS", "MAX_CHANNELS", "MAX_DEVICES", "MAX_MACHINES", "MAX_ITERS", "MAX_SAMPLES",
           "MAX_LR"]

MAX_BATCH = 65536            # images per batch (and per benchmark iteration)
MAX_CLASSES = 1_000_000      # classifier outputs
MAX_IMAGE_SIZE = 4096        # square image side in px
MAX_THREADS = 1024           # runtime threads
MAX_WORKERS = 256            # data worker processes
MAX_CHANNELS = 256           # input channels of a model summary
MAX_DEVICES = 256            # GPU processes per machine
MAX_MACHINES = 65536         # machines of one job
MAX_ITERS = 1_000_000        # timed iterations / batches of the measuring tools
MAX_SAMPLES = 100_000_000    # samples drawn by a statistics pass
MAX_LR = 10.0                # a learning rate (1e3 typed for 1e-3 is refused)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2): `error: MESSAGE (see PROG --help)`."""

    def error(self, message):
        prefix = "the following arguments are required: "
        if message.startswith(prefix):
            message = "missing " + ", ".join(self._required_names(message[len(prefix):].split(", ")))
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

    def _required_names(self, names):
        """The positionals argparse says are missing, without the optional ones (nargs * or ?) that
        parse_intermixed_args wrongly lists, each by its metavar (CONFIG rather than config)."""
        by_dest = {a.dest: a for a in self._actions if not a.option_strings}
        by_dest.update({a.metavar: a for a in self._actions if not a.option_strings and isinstance(a.metavar, str)})
        kept = []
        for name in names:
            action = by_dest.get(name)
            if action is not None and action.nargs in ("*", "?"):
                continue
            kept.append(action.metavar if action is not None and isinstance(action.metavar, str) else name.upper())
        return kept or names


def bounded_int(low, high):
    """argparse `type=`: a whole number in [low, high], else argparse's one-line error naming the flag."""
    def parse(text):
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def bounded_float(low, high):
    """argparse `type=`: a finite number in [low, high] (nan and inf refused), else argparse's one-line error
    naming the flag."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a number in [{low:g}, {high:g}], got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a finite number in [{low:g}, {high:g}], got {text!r}")
        return value

    parse.__name__ = f"number in [{low:g}, {high:g}]"
    return parse
