#!/usr/bin/env python3
"""What each loss-recovery rule is worth: the simulator's reference set with every rule on,
then with each rule left out in turn, on the same seeds (docs/design/RECOVERY.md).

    python3 benches/recovery/ablate.py [--ina target/release/ina] [--out DIR] [--rules a,b+c]
        [--configs n8-1,n32-1,...] [--table] [--baseline]

`--rules a,b+c` measures `a` alone and `b` and `c` left out together. Runs are cached in DIR (one JSON per configuration, rule set and seeds), so an interrupted
run resumes. `--table` prints the table from what DIR holds. A rule pays for itself where
leaving it out costs, in some configuration, more than twice the standard error of the
per-seed differences (paired by seed); the costs are fractions of the lossless goodput.
"""

import argparse
import json
import math
import os
import subprocess
import sys

# name: (flags, seeds)
CONFIGS = {
    "n8-1": ("--workers 8 --loss 0.01", 12),
    "n32-1": ("--workers 32 --loss 0.01", 6),
    "n8-10": ("--workers 8 --loss 0.1", 8),
    "n32-10": ("--workers 32 --loss 0.1", 4),
    "n8-20dr": ("--workers 8 --loss 0.2 --duplicate 0.05 --reorder 0.05", 12),
    "4x32-1": ("--workers 128 --rack-size 32 --loss 0.01", 3),
    "32x32-1": ("--workers 1024 --rack-size 32 --loss 0.01", 1),
}
DEFAULT_CONFIGS = ["n8-1", "n32-1", "n8-10", "n32-10", "n8-20dr", "4x32-1"]
COMMON = "--elements 4194304 --generated"


def run(ina, out, config, without, lossless=False):
    flags, seeds = CONFIGS[config]
    if lossless:
        words = flags.split()
        kept = []
        for i, w in enumerate(words):
            dropped = ("--loss", "--duplicate", "--reorder")
            if w in dropped or (i > 0 and words[i - 1] in dropped):
                continue
            kept.append(w)
        flags = " ".join(kept)
        seeds = 1
    tag = "lossless" if lossless else (without or "all")
    path = os.path.join(out, f"{config}.{tag}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    cmd = [ina, "sim", *COMMON.split(), *flags.split(), "--seeds", str(seeds), "--json", path + ".tmp"]
    if without and not lossless:
        cmd += ["--without", without.replace("+", ",")]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    os.replace(path + ".tmp", path)
    with open(path) as f:
        return json.load(f)


def goodputs(rows):
    return {r["seed"]: r["goodput_gbit_per_s"] for r in rows}


def ok(rows):
    return all(r["error"] is None and r["identical"] and r["within_bound"] for r in rows)


def stats(base, other, lossless):
    gb, go = goodputs(base), goodputs(other)
    diffs = [(gb[s] - go[s]) / lossless for s in gb if s in go]
    n = len(diffs)
    mean = sum(diffs) / n
    if n > 1:
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        se = sd / math.sqrt(n)
    else:
        se = float("nan")
    return mean, se


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ina", default="target/release/ina")
    ap.add_argument("--out", default="target/recovery-ablation")
    ap.add_argument("--rules", default="")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--baseline", action="store_true", help="only the runs with every rule on")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    configs = [c for c in args.configs.split(",") if c]
    rules = [r for r in args.rules.split(",") if r]
    if args.baseline:
        rules = []
    elif not rules:
        help_text = subprocess.run([args.ina, "sim", "--without", "?"], capture_output=True, text=True).stderr
        start = help_text.index("(the rules: ") + len("(the rules: ")
        rules = list(dict.fromkeys(help_text[start:help_text.index(")", start)].split(", ")))
    if args.table:
        table(args, configs, rules)
        return
    for c in configs:
        run(args.ina, args.out, c, None, lossless=True)
        run(args.ina, args.out, c, None)
    for r in rules:
        for c in configs:
            run(args.ina, args.out, c, r)
    table(args, configs, rules)


def table(args, configs, rules):
    def load(c, tag):
        p = os.path.join(args.out, f"{c}.{tag}.json")
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return json.load(f)

    head = "| rule | " + " | ".join(configs) + " | pays |"
    print(head)
    print("|" + "---|" * (len(configs) + 2))
    base_row = ["all rules (fraction of lossless)"]
    for c in configs:
        base, ll = load(c, "all"), load(c, "lossless")
        if base is None or ll is None:
            base_row.append("")
            continue
        g = goodputs(base)
        base_row.append(f"{sum(g.values()) / len(g) / ll[0]['goodput_gbit_per_s']:.4f}")
    print("| " + " | ".join(base_row) + " | |")
    for r in rules:
        cells, pays = [], False
        for c in configs:
            base, other, ll = load(c, "all"), load(c, r), load(c, "lossless")
            if base is None or other is None or ll is None:
                cells.append("")
                continue
            if not ok(other):
                cells.append("FAILS")
                pays = True
                continue
            mean, se = stats(base, other, ll[0]["goodput_gbit_per_s"])
            if not math.isnan(se) and mean > 2 * se and mean > 0:
                pays = True
            cells.append(f"{mean:+.4f} ± {se:.4f}")
        print(f"| {r} | " + " | ".join(cells) + f" | {'yes' if pays else 'no'} |")


if __name__ == "__main__":
    main()
