#!/usr/bin/python3
"""Runs one example in all three modes (none, lossless, near-lossless) and with the
aggressive near-lossless preset (R 3, A -10, error feedback), with the same seed, then
writes a PNG plot of training loss against step and a Markdown table of the results, with
the targets checked: near-lossless within 0.5 percentage points of none on held-out
accuracy (digits) or within 2% on held-out loss (text), ratio >= 3x, lossless == none.

    /usr/bin/python3 examples/compare.py --example digits --out-dir out/compare
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import progress_line  # noqa: E402

MODES = ("none", "lossless", "near-lossless", "aggressive")
# The example's flags for each row of the table.
MODE_FLAGS = {"none": ["--mode", "none"], "lossless": ["--mode", "lossless"],
              "near-lossless": ["--mode", "near-lossless"],
              "aggressive": ["--mode", "near-lossless", "--preset", "aggressive"]}
SCRIPTS = {"digits": "train_digits.py", "text": "train_text.py"}
# The flags run_mode sets on every row; the first ones are compare.py's own too.
OWN_FLAGS = ("--workers", "--shards", "--seed", "--steps", "--progress")
ROW_FLAGS = OWN_FLAGS + ("--mode", "--preset", "--error-feedback", "--loss-log")
# Flags of the example for the near-lossless row only (the aggressive row keeps its preset).
NEAR_FLAGS = ("--rel-bits", "--abs-log2")


def split_extra(extra):
    """The example's flags after --: (for every row, for the near-lossless row). Raises
    ValueError for a flag that would change what a row is (given again after --, it would
    win in every row, and the table would compare runs that are not what its rows say)."""
    common, near = [], []
    i = 0
    while i < len(extra):
        name, has_value = extra[i].split("=", 1)[0], "=" in extra[i]
        if name in OWN_FLAGS:
            raise ValueError("%s after -- : give compare.py's own %s (before --)" % (name, name))
        if name in ROW_FLAGS:
            raise ValueError("%s is set by compare.py for each row (%s) and cannot be given to "
                             "the example" % (name, ", ".join(MODES)))
        take = 1 if has_value or name not in NEAR_FLAGS else 2
        (near if name in NEAR_FLAGS else common).extend(extra[i:i + take])
        i += take
    return common, near


def run_mode(example, mode, args, log_path):
    cmd = [sys.executable, os.path.join(HERE, SCRIPTS[example])] + MODE_FLAGS[mode] + [
           "--workers", str(args.workers), "--shards", str(args.shards),
           "--seed", str(args.seed), "--loss-log", log_path,
           # Resolved here: the example's stderr is ours, so auto means the same there.
           "--progress", "always" if progress_line.enabled(args.progress) else "never"
           ] + args.extra + (args.near_extra if mode == "near-lossless" else [])
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    print("compare: " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit("compare: %s %s failed (%d)" % (example, mode, out.returncode))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    with open(log_path) as f:
        log = json.load(f)
    return result, log["losses"], log.get("transport", "?")


def plot(example, curves, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"none": "-", "lossless": "--", "near-lossless": ":", "aggressive": "-."}
    for mode, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, styles[mode], label=mode, linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_yscale("log")
    ax.set_title("%s: training loss by gradient compression mode" % example)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def checks(example, results):
    none, lossless, near = (results[m] for m in MODES[:3])
    lines = []
    if example == "digits":
        delta = abs(near["test_accuracy"] - none["test_accuracy"]) * 100
        lines.append(("near-lossless held-out accuracy within 0.5 pp of none",
                      "%.2f pp" % delta, delta <= 0.5))
        same = lossless["test_accuracy"] == none["test_accuracy"]
    else:
        rel = abs(near["test_loss"] - none["test_loss"]) / none["test_loss"] * 100
        lines.append(("near-lossless held-out loss within 2% of none", "%.4f%%" % rel, rel <= 2))
        same = lossless["test_loss"] == none["test_loss"]
    lines.append(("near-lossless ratio >= 3x", "%.2fx" % near["ratio"], near["ratio"] >= 3))
    same = same and lossless["train_loss"] == none["train_loss"]
    lines.append(("lossless equals none (train loss and held-out metric, as printed)",
                  "equal" if same else "differs", same))
    return lines


def table(example, results, transport, args):
    metric = "test_accuracy" if example == "digits" else "test_loss"
    rows = ["| mode | train_loss | %s | raw MB | wire MB | ratio | seconds |" % metric,
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for m in MODES:
        r = results[m]
        rows.append("| %s | %s | %s | %.1f | %.1f | %.2fx | %.1f |" % (
            m, r["train_loss"], r[metric], r["raw_bytes"] / 1e6, r["wire_bytes"] / 1e6,
            r["ratio"], r["seconds"]))
    head = ("%s, %d workers, %d shards, %s steps, seed %d, transport %s" % (
        example, args.workers, args.shards, results["none"]["steps"], args.seed, transport))
    if args.extra:
        head += ", every row: %s" % " ".join(args.extra)
    if args.near_extra:
        head += ", near-lossless row: %s" % " ".join(args.near_extra)
    rows = [head, ""] + rows + ["", "| target | measured | met |", "| --- | --- | --- |"]
    rows += ["| %s | %s | %s |" % (name, value, "yes" if ok else "**no**")
             for name, value, ok in checks(example, results)]
    return "\n".join(rows) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--example", choices=sorted(SCRIPTS), default="digits")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="default: the example's own")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(HERE), "out", "compare"))
    p.add_argument("--progress", choices=progress_line.MODES, default="auto",
                   help="each run's progress line (step, steps/s, ratio, ETA) on stderr; "
                        "auto: only when stderr is a terminal")
    p.add_argument("extra", nargs="*",
                   help="more flags for the example (after --); --rel-bits and --abs-log2 "
                        "go to the near-lossless row only")
    args = p.parse_args()
    for flag in ("workers", "shards"):
        if getattr(args, flag) < 1:
            p.error("--%s must be at least 1, got %d" % (flag, getattr(args, flag)))
    if args.steps < 0:
        p.error("--steps must be at least 1 (or 0 for the example's own), got %d" % args.steps)
    try:
        args.extra, args.near_extra = split_extra(args.extra)
    except ValueError as e:
        p.error(str(e))
    os.makedirs(args.out_dir, exist_ok=True)
    results, curves, transport = {}, {}, "?"
    for mode in MODES:
        log = os.path.join(args.out_dir, "%s_%s_losses.json" % (args.example, mode))
        results[mode], curves[mode], transport = run_mode(args.example, mode, args, log)
        print(json.dumps(results[mode]), flush=True)
    png = os.path.join(args.out_dir, "%s_loss.png" % args.example)
    md = os.path.join(args.out_dir, "%s_table.md" % args.example)
    plot(args.example, curves, png)
    text = table(args.example, results, transport, args)
    with open(md, "w") as f:
        f.write(text)
    print(text)
    print("plot: %s\ntable: %s" % (png, md))


if __name__ == "__main__":
    main()
