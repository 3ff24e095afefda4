#!/usr/bin/env python3
"""Sums an ncu CSV log (one metric, gpu__time_duration.sum, per kernel launch) by kernel name.

    ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file LOG tandem run ...
    tools/gpu/kernel_profile.py LOG [--steps N] [--json OUT]

Prints the kernels that took the most GPU time: launches, total and mean microseconds, share of
all kernel time, and per decode step when --steps says how many steps the run made. Used by
tools/gpu-check.sh to show where a decode step's time goes (issue 15: decode at 4% of the
roofline); run it by hand on any ncu log of that shape.
"""
import argparse
import csv
import json
import sys
from collections import defaultdict


def read_launches(path):
    """(kernel name, nanoseconds) per launch, from the CSV part of an ncu log."""
    with open(path, newline="", errors="replace") as f:
        lines = [line for line in f if not line.startswith("==")]
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header (\"ID\",...): was ncu run with --csv and a metric?")
    launches = []
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = (row.get("Metric Value") or "").replace(",", "")
        try:
            nanoseconds = float(value)
        except ValueError:
            continue
        if row.get("Metric Unit") in ("usecond", "us"):
            nanoseconds *= 1e3
        elif row.get("Metric Unit") in ("msecond", "ms"):
            nanoseconds *= 1e6
        launches.append((row.get("Kernel Name", "?"), nanoseconds))
    return launches


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log")
    parser.add_argument("--steps", type=int, default=0, help="decode steps in the profiled run")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", help="write the table as JSON here")
    args = parser.parse_args()

    launches = read_launches(args.log)
    if not launches:
        sys.exit(f"{args.log}: no gpu__time_duration.sum values")
    by_name = defaultdict(lambda: [0, 0.0])
    for name, nanoseconds in launches:
        by_name[name][0] += 1
        by_name[name][1] += nanoseconds
    total = sum(ns for _, ns in launches)
    rows = sorted(by_name.items(), key=lambda item: -item[1][1])
    print(f"{len(launches)} kernel launches, {total / 1e6:.2f} ms of kernel time"
          + (f", {total / 1e3 / args.steps:.0f} us per step if all were decode" if args.steps else ""))
    print(f"{'kernel':<60} {'launches':>8} {'total us':>10} {'mean us':>9} {'share':>6}")
    table = []
    for name, (count, nanoseconds) in rows[: args.top]:
        short = name if len(name) <= 60 else name[:57] + "..."
        print(f"{short:<60} {count:>8} {nanoseconds / 1e3:>10.1f} {nanoseconds / 1e3 / count:>9.2f} "
              f"{100 * nanoseconds / total:>5.1f}%")
        table.append({"kernel": name, "launches": count, "total_us": nanoseconds / 1e3,
                      "mean_us": nanoseconds / 1e3 / count, "share": nanoseconds / total})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"launches": len(launches), "total_us": total / 1e3, "kernels": table}, f, indent=2)


if __name__ == "__main__":
    main()
