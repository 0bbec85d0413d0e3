"""The progress line of long runs, as gcomp_worker prints it (base/progress.h):

    step 1234/10000  56.7 steps/s  ratio 4.21x  ETA 2m35s

rewritten in place with '\\r' on a terminal and nothing at all otherwise, so that a log
file never fills with carriage returns. The meter takes times from the caller, so it is
tested with fixed times.
"""
import math
import sys

MODES = ("auto", "always", "never")


def enabled(mode, stream=None):
    """Whether to show progress on `stream` (default stderr); auto: only on a terminal."""
    if mode not in MODES:
        raise ValueError("progress mode %r is not one of %s" % (mode, ", ".join(MODES)))
    if mode != "auto":
        return mode == "always"
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def format_eta(seconds):
    """'45s', '2m35s', '1h02m', '3d04h' (whole seconds, rounded up); '?' when unknown."""
    if seconds is None or seconds < 0 or math.isinf(seconds) or math.isnan(seconds):
        return "?"
    s = int(math.ceil(seconds))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)


class Meter:
    """Steps done, a smoothed steps/s, the compression ratio and the ETA.

    total: steps in the run (0: unknown, no "/total" and no ETA); start: when step 0 began
    (seconds, e.g. time.monotonic()), though when step 1 is seen on its own the rate is
    measured from its end instead; min_interval: update() returns a line at most this
    often, and always for the last step; smoothing: weight of the newest interval in the
    steps/s (1: none).
    """

    def __init__(self, total, start, min_interval=0.5, smoothing=0.3):
        self.total = max(0, int(total))
        self.min_interval = min_interval
        self.smoothing = smoothing
        self.steps = 0
        self.raw = 0
        self.wire = 0
        self.rate = 0.0
        self._rate_steps = 0
        self._rate_time = start
        self._last_shown = None

    def update(self, steps, raw_bytes, wire_bytes, now):
        """Records `steps` done at `now` with cumulative byte counts; the line to show, or
        None when the last one is younger than min_interval."""
        self.steps, self.raw, self.wire = steps, raw_bytes, wire_bytes
        last = self.total > 0 and steps >= self.total
        if not last and self._last_shown is not None and now - self._last_shown < self.min_interval:
            return None
        seconds = now - self._rate_time
        if self._rate_steps == 0 and steps == 1:
            # Step 1 carries the warm-up (connections, first allocations): the rate starts
            # after it.
            self._rate_steps, self._rate_time = 1, now
        elif seconds > 0 and steps > self._rate_steps:
            interval = (steps - self._rate_steps) / seconds
            self.rate = interval if self.rate == 0 else (
                self.smoothing * interval + (1 - self.smoothing) * self.rate)
            self._rate_steps, self._rate_time = steps, now
        self._last_shown = now
        return self.line()

    def line(self):
        text = "step %d" % self.steps
        if self.total:
            text += "/%d" % self.total
        text += "  %.1f steps/s" % self.rate if self.rate > 0 else "  - steps/s"
        if self.wire > 0:
            text += "  ratio %.2fx" % (self.raw / self.wire)
        if self.total:
            left = max(0, self.total - self.steps)
            eta = 0.0 if left == 0 else (left / self.rate if self.rate > 0 else None)
            text += "  ETA " + format_eta(eta)
        return text


class Printer:
    """Writes lines over each other on `stream` when enabled; nothing when not."""

    def __init__(self, stream, enabled_):
        self.stream = stream
        self.enabled = enabled_
        self._last_len = 0
        self._shown = False

    def show(self, line):
        if not self.enabled or line is None:
            return
        pad = " " * max(0, self._last_len - len(line))
        self._last_len = len(line)
        self.stream.write("\r" + line + pad)
        self.stream.flush()
        self._shown = True

    def finish(self, line=None):
        """Shows `line` if given, then ends the line so that later output starts clean."""
        if not self.enabled:
            return
        if line:
            self.show(line)
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
        self._shown = False
        self._last_len = 0
