#!/usr/bin/env python3
"""Sums up Nsight Compute's CSV (ncu --csv, the details page: one row per kernel launch and metric)
as one line per launch: kernel, grid, duration, DRAM bytes read, the bandwidth that makes, DRAM
throughput and active warps as percentages of peak.
    scripts/ncu_summary.py FILE.csv
With --steps N (a model's decode steps, each ending with the sampling kernel): the last step's
launches in order, then each kernel's mean time per step over the last N steps, and the sum
(kernels run one at a time under the profiler: the gaps between them are not counted).
    scripts/ncu_summary.py --steps N FILE.csv"""
import csv
import sys

# Units to base units (bytes, seconds), as Nsight Compute writes them ("ns" in its CSV, "nsecond"
# on its pages); thousands come with commas ("22,368").
SCALE = {"": 1, "%": 1, "byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
         "ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
         "s": 1, "second": 1}


class UnknownUnit(Exception):
    pass


def number(text, unit=""):
    value = float(text.replace(",", ""))
    key = unit.strip().lower()
    if key not in SCALE:
        raise UnknownUnit("unit %r not known (value %s)" % (unit, text))
    return value * SCALE[key]


def launches(lines):
    """ID → {"kernel", "grid", metric name → value in base units} from the CSV rows (details
    page, long form: "Metric Name", "Metric Unit", "Metric Value"; or raw page: a column per
    metric, its unit in the row under the header)."""
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return {}
    rows = list(csv.reader(lines[start:]))
    header, body = rows[0], rows[1:]
    out = {}
    if "Metric Name" in header:
        col = {name: header.index(name) for name in header}
        for r in body:
            if len(r) != len(header):
                continue
            d = out.setdefault(r[col["ID"]], {"kernel": r[col["Kernel Name"]], "grid": r[col.get("Grid Size", 0)]})
            try:
                d[r[col["Metric Name"]]] = number(r[col["Metric Value"]], r[col["Metric Unit"]])
            except ValueError:
                pass
        return out
    units = body[0] if body and not body[0][0].strip().isdigit() else [""] * len(header)
    for r in body:
        if len(r) != len(header) or not r[0].strip().isdigit():
            continue
        d = {"kernel": r[header.index("Kernel Name")] if "Kernel Name" in header else "?",
             "grid": r[header.index("Grid Size")] if "Grid Size" in header else "?"}
        for name, unit, value in zip(header, units, r):
            try:
                d[name] = number(value, unit)
            except ValueError:
                pass
        out[r[0]] = d
    return out


def short_name(kernel):
    kernel = kernel[5:] if kernel.startswith("void ") else kernel
    head = kernel.split("<")[0]
    return head.split("::")[-1] + kernel[len(head):]  # without its namespaces


def line(launch_id, d):
    secs = d.get("gpu__time_duration.sum", 0)
    read = d.get("dram__bytes_read.sum", 0)
    return "%-5s %-40s grid %-14s %8.1f us %9.2f MB read %7.0f GB/s  dram %5.1f%%" % (
        launch_id, short_name(d["kernel"])[:40], d["grid"], secs * 1e6, read / 1e6,
        read / secs / 1e9 if secs else 0,
        d.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0))


def steps_summary(found, n):
    """The last n decode steps (each closed by the sampling kernel)."""
    ids = sorted(found, key=lambda k: int(k) if k.isdigit() else 0)
    ends = [i for i, k in enumerate(ids) if "sample_kernel" in found[k]["kernel"]]
    if len(ends) < n + 1:
        print("ncu_summary: %d steps found, %d asked for" % (max(0, len(ends) - 1), n))
        return 1
    last = ids[ends[-2] + 1:ends[-1] + 1]
    print("the last step, launch by launch:")
    for k in last:
        print(line(k, found[k]))
    per = {}
    total = 0.0
    for k in ids[ends[-n - 1] + 1:ends[-1] + 1]:
        name = short_name(found[k]["kernel"]).split("(")[0]
        t = found[k].get("gpu__time_duration.sum", 0) / n
        b = found[k].get("dram__bytes_read.sum", 0) / n
        c, tt, bb = per.get(name, (0, 0.0, 0.0))
        per[name] = (c + 1.0 / n, tt + t, bb + b)
        total += t
    print("per step, over the last %d (launches, time, DRAM read):" % n)
    for name, (c, t, b) in sorted(per.items(), key=lambda x: -x[1][1]):
        print("  %-60s %5.1f %9.1f us %9.2f MB %7.0f GB/s" % (name[:60], c, t * 1e6, b / 1e6,
                                                           b / t / 1e9 if t else 0))
    print("kernels per step: %d launches, %.1f us" % (len(last), total * 1e6))
    return 0


def main():
    args = sys.argv[1:]
    steps = 0
    if args[:1] == ["--steps"]:
        steps, args = int(args[1]), args[2:]
    with open(args[0], errors="replace") as f:
        try:
            found = launches(f.read().splitlines())
        except UnknownUnit as e:
            print("ncu_summary:", e)
            return 1
    if not found:
        print("no kernel launches in", args[0])
        return 1
    if steps:
        return steps_summary(found, steps)
    for launch_id in sorted(found, key=lambda k: int(k) if k.isdigit() else 0):
        d = found[launch_id]
        secs = d.get("gpu__time_duration.sum", 0)
        read = d.get("dram__bytes_read.sum", 0)
        kernel = d["kernel"][5:] if d["kernel"].startswith("void ") else d["kernel"]
        head = kernel.split("<")[0]
        kernel = head.split("::")[-1] + kernel[len(head):]  # without its namespaces
        print("%-4s %-40s grid %-14s %8.1f us %9.1f MB read %7.0f GB/s  dram %5.1f%%  warps %5.1f%%" % (
            launch_id, kernel[:40], d["grid"], secs * 1e6, read / 1e6, read / secs / 1e9 if secs else 0,
            d.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0),
            d.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
