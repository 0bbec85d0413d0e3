"""The progress line: formatting with fixed times, rate smoothing, the terminal rule."""
import io
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import progress_line  # noqa: E402


def test_line_has_step_rate_ratio_and_eta():
    meter = progress_line.Meter(10000, start=100.0)
    # 1234 steps in 21.76 s: 56.7 steps/s; 8766 left: 154.6 s, shown rounded up.
    line = meter.update(1234, 421, 100, now=121.76)
    assert line == "step 1234/10000  56.7 steps/s  ratio 4.21x  ETA 2m35s"


def test_same_line_as_the_cpp_worker_for_the_same_numbers():
    # base/progress_test.cc: ProgressMeter.FormatsStepRateRatioAndEta expects this string.
    meter = progress_line.Meter(10000, start=0.0)
    assert meter.update(1234, 421, 100, now=21.76) == \
        "step 1234/10000  56.7 steps/s  ratio 4.21x  ETA 2m35s"


@pytest.mark.parametrize("seconds,text", [
    (0, "0s"), (0.1, "1s"), (45, "45s"), (59.5, "1m00s"), (155, "2m35s"),
    (3725, "1h02m"), (76 * 3600, "3d04h"), (None, "?"), (-1, "?"), (float("inf"), "?")])
def test_format_eta(seconds, text):
    assert progress_line.format_eta(seconds) == text


def test_at_most_one_line_per_interval_but_always_the_last():
    meter = progress_line.Meter(4, start=0.0)
    assert meter.update(1, 0, 0, now=0.1) is not None
    assert meter.update(2, 0, 0, now=0.3) is None
    assert meter.update(3, 0, 0, now=0.6) is not None
    last = meter.update(4, 0, 0, now=0.7)
    assert last.startswith("step 4/4 ") and last.endswith("ETA 0s")
    assert "ratio" not in last  # no wire bytes, no ratio


def test_rate_is_smoothed_and_unknown_total_has_no_eta():
    meter = progress_line.Meter(0, start=0.0, smoothing=0.5)
    meter.update(10, 0, 0, now=1.0)
    assert meter.rate == pytest.approx(10)
    meter.update(40, 0, 0, now=2.0)
    assert meter.rate == pytest.approx(20)
    assert meter.line() == "step 40  20.0 steps/s"


def test_rate_starts_after_the_first_step():
    meter = progress_line.Meter(100, start=0.0)
    # Step 1 took 10 s of warm-up; steps 2..21 then took 1 s: 20 steps/s, not 21/11.
    assert meter.update(1, 0, 0, now=10.0) == "step 1/100  - steps/s  ETA ?"
    assert meter.update(21, 0, 0, now=11.0) == "step 21/100  20.0 steps/s  ETA 4s"


def test_before_any_step_rate_and_eta_are_unknown():
    assert progress_line.Meter(100, start=0.0).update(0, 0, 0, now=3.0) == \
        "step 0/100  - steps/s  ETA ?"


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_auto_follows_the_terminal_and_bad_modes_are_named():
    assert progress_line.enabled("auto", FakeTty())
    assert not progress_line.enabled("auto", io.StringIO())
    assert progress_line.enabled("always", io.StringIO())
    assert not progress_line.enabled("never", FakeTty())
    with pytest.raises(ValueError, match="sometimes"):
        progress_line.enabled("sometimes")


def test_printer_rewrites_one_line_and_is_silent_when_disabled():
    out = io.StringIO()
    p = progress_line.Printer(out, True)
    p.show("step 9/10  long")
    p.show("step 10/10")
    p.finish()
    assert out.getvalue() == "\rstep 9/10  long\rstep 10/10     \n"
    quiet = io.StringIO()
    q = progress_line.Printer(quiet, False)
    q.show("step 1/2")
    q.finish("step 2/2")
    assert quiet.getvalue() == ""


def _train(progress):
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "train_digits.py"), "--mode", "near-lossless",
           "--workers", "2", "--shards", "2", "--steps", "2", "--batch", "32", "--seed", "1"]
    if progress:
        cmd += ["--progress", progress]
    # Bytes, decoded by hand: text mode would turn every '\r' into '\n'.
    out = subprocess.run(cmd, capture_output=True, timeout=600)
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()
    return out


def test_training_shows_progress_only_when_asked_and_keeps_its_result_line():
    keys = {"mode", "steps", "train_loss", "test_accuracy", "raw_bytes", "wire_bytes",
            "ratio", "seconds", "transport"}
    shown = _train("always")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "\rstep 1/2  - steps/s" in shown.stderr, shown.stderr
    assert "\rstep 2/2 " in shown.stderr and "ETA 0s" in shown.stderr, shown.stderr
    assert set(json.loads(shown.stdout.strip().splitlines()[-1])) == keys
    assert "\r" not in shown.stdout
    quiet = _train(None)  # auto, and stderr is a pipe here
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "\r" not in quiet.stderr and "steps/s" not in quiet.stderr, quiet.stderr
    assert set(json.loads(quiet.stdout.strip().splitlines()[-1])) == keys
