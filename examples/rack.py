"""Runs examples/train.py on an emulated rack (``ina testbed``), once with Gloo and once with
ina through the software switch, and compares them. Needs root (network namespaces).

Each rank runs in a worker namespace of its own, started by its own ``torchrun --nnodes N``
as on separate hosts; every link (Gloo's ring traffic and ina's alike) is rate-limited to
``--rate`` each way. Arguments this script does not know go to train.py::

    sudo python3 examples/rack.py digits --rate 1gbit          # accuracy and loss of both
    sudo python3 examples/rack.py wide --rate 1gbit            # time per step of both

Prints a JSON summary; ``--plot FILE`` draws the digits runs' loss curves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWITCH_IP = "198.18.0.100"
SWITCH_PORT = 18766
WORKER_PORT = 18800


def ina_binary() -> str:
    for p in (os.environ.get("INA_BIN"), ROOT / "target/release/ina", shutil.which("ina")):
        if p and Path(p).exists():
            return str(p)
    sys.exit("no ina binary: cargo build --release, or set INA_BIN")


def worker_ip(rank: int) -> str:
    return f"198.18.1.{rank + 1}"


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=True, **kw)


def run(comm: str, args, binary: str, tmp: Path, train_args: list[str], master_port: int) -> dict:
    """One training run of `comm` on the rack; returns rank 0's report."""
    n = args.workers
    switch = None
    if comm == "ina":
        workers = ",".join(f"{worker_ip(r)}:{WORKER_PORT}" for r in range(n))
        switch = subprocess.Popen(
            ["ip", "netns", "exec", f"{args.name}-hub", binary, "switch",
             "--listen", f"{SWITCH_IP}:{SWITCH_PORT}",
             "--job", f"id=1;slots=0..{args.slots};elems={args.elems};workers={workers}"],
            stdout=open(tmp / "switch.log", "w"), stderr=subprocess.STDOUT,
        )
        time.sleep(0.5)
    out = tmp / f"{comm}.json"
    procs = []
    try:
        for r in range(n):
            env = {
                **os.environ,
                "GLOO_SOCKET_IFNAME": "eth0",
                "OMP_NUM_THREADS": "1",
                "INA_SWITCH": f"{SWITCH_IP}:{SWITCH_PORT}",
                "INA_BIND": f"{worker_ip(r)}:{WORKER_PORT}",
                "INA_JOB_ID": "1",
            }
            env.pop("INA_CONTROLLER", None)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{args.name}-w{r}", sys.executable, "-m", "torch.distributed.run",
                 "--nnodes", str(n), "--node-rank", str(r), "--nproc-per-node", "1",
                 "--master-addr", worker_ip(0), "--master-port", str(master_port),
                 str(ROOT / "examples/train.py"), "--comm", comm, "--out", str(out), *train_args],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            ))
        errors = []
        for r, p in enumerate(procs):
            _, err = p.communicate(timeout=args.timeout)
            if p.returncode != 0:
                said = [l for l in err.splitlines() if l.startswith(f"[rank{r}]:") and "Error" in l]
                errors.append(f"rank {r}: {said[-1] if said else err[-2000:]}")
        if errors:
            sys.exit(f"{comm} failed:\n" + "\n".join(errors))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if switch is not None:
            switch.terminate()
            switch.wait()
            if os.environ.get("INA_RACK_SWITCH_LOG"):
                shutil.copy(tmp / "switch.log", os.environ["INA_RACK_SWITCH_LOG"])
    return json.loads(out.read_text())


def plot(reports: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for comm, style in (("gloo", "-"), ("ina", "--")):
        e = reports[comm]["epochs"]
        xs = [x["epoch"] + 1 for x in e]
        a.plot(xs, [x["train_loss"] for x in e], style, label=f"{comm} train")
        a.plot(xs, [x["test_loss"] for x in e], style, label=f"{comm} test")
        b.plot(xs, [100 * x["test_accuracy"] for x in e], style, label=comm)
    a.set_xlabel("epoch"), a.set_ylabel("cross-entropy"), a.set_yscale("log"), a.legend()
    b.set_xlabel("epoch"), b.set_ylabel("test accuracy, %"), b.legend()
    fig.suptitle(f"digits MLP, 4 ranks, DDP: Gloo against ina (examples/rack.py digits)")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.endswith(".svg") else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=["digits", "wide"])
    ap.add_argument("--name", default="inapy", help="the testbed's name")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rate", default="1gbit", help="every link's rate each way")
    ap.add_argument("--elems", type=int, default=256)
    ap.add_argument("--slots", type=int, default=64, help="the job's slots (one block of 64, as ina bench --testbed)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--plot", help="digits: write the loss curves here (.svg or .png)")
    ap.add_argument("--keep", action="store_true", help="keep the testbed afterwards")
    args, more = ap.parse_known_args()
    if os.geteuid() != 0:
        sys.exit("the rack needs root (network namespaces)")
    binary = ina_binary()
    subprocess.run([binary, "testbed", "down", "--name", args.name], capture_output=True)
    sh(binary, "testbed", "up", "--name", args.name, "--workers", str(args.workers), "--rate", args.rate,
       stdout=subprocess.DEVNULL)
    # Any other argument is train.py's (--epochs, --steps, --width, --batch, ...).
    train_args = ["--model", args.model, *more]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            reports = {
                c: run(c, args, binary, Path(tmp), train_args, 29500 + i)
                for i, c in enumerate(("gloo", "ina"))
            }
    finally:
        if not args.keep:
            subprocess.run([binary, "testbed", "down", "--name", args.name], capture_output=True)
    summary: dict = {"rate": args.rate, "workers": args.workers, "model": args.model}
    for c, r in reports.items():
        s = {"ranks_identical": r["ranks_identical"], "parameters": r["parameters"]}
        if args.model == "digits":
            last = r["epochs"][-1]
            s.update(test_accuracy=last["test_accuracy"], test_loss=last["test_loss"], train_loss=last["train_loss"])
        else:
            s.update(median_step_s=r["median_step_s"], median_step_cpu_s=r["median_step_cpu_s"], compute_s=r["compute_s"])
        summary[c] = s
    if args.model == "digits":
        g, i = reports["gloo"]["epochs"], reports["ina"]["epochs"]
        summary["accuracy_difference_points"] = 100 * (i[-1]["test_accuracy"] - g[-1]["test_accuracy"])
        summary["max_train_loss_relative_difference"] = max(
            abs(a["train_loss"] - b["train_loss"]) / b["train_loss"] for a, b in zip(i, g)
        )
        if args.plot:
            plot(reports, args.plot)
    else:
        summary["gloo_over_ina_step_time"] = reports["gloo"]["median_step_s"] / reports["ina"]["median_step_s"]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
