#!/usr/bin/env python3
"""Runs the workspace's test binaries a few at a time instead of one by one.

`cargo test` runs test binaries sequentially; most of ours spend their time
waiting on real control planes (etcd, kube-apiserver, controllers), not on
the CPU, so two binaries side by side take little longer than one. This
builds every test target once (`cargo test --no-run`), then runs the
binaries TEST_JOBS at a time (default 2), longest first by the durations the
previous run recorded in $TENANTRY_CACHE/test-durations.tsv (binaries without
a record go first: a new one may be long). Doctests run as one more job.

Each binary runs as `cargo test` runs it: from its package's folder, with
CARGO_MANIFEST_DIR and CARGO_PKG_NAME set, in a process group of its own so
a deadline can stop it and everything it started. Its output is printed
whole when it ends, so concurrent binaries do not interleave; a table of
durations and results closes the run. The exit status is non-zero if any
binary failed or the deadline passed.

Usage: hack/run-tests.py [--jobs N] [--deadline-minutes M] [binary-name ...]
       (names filter the binaries, e.g. `deployed kubevirt_machine`; extra
       arguments for the test harness follow `--`.)

Python rather than Rust: it drives cargo and processes, needs no build of
its own, and runs before the workspace compiles.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TENANTRY_CACHE", Path.home() / ".cache" / "tenantry"))
DURATIONS = CACHE / "test-durations.tsv"


def build_test_binaries():
    """Builds every test target; returns [(name, executable, package dir, package)]."""
    cmd = [
        "cargo", "test", "--workspace", "--locked", "--no-run",
        "--message-format=json-render-diagnostics",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"run-tests: `{' '.join(cmd)}` failed ({proc.returncode})")
    binaries = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        manifest = Path(msg["manifest_path"])
        package = package_name(msg)
        kind = target["kind"][0]
        # Unit tests of a lib or bin are named after their crate; integration
        # tests and benches after their file.
        name = target["name"] if kind in ("test", "bench") else f"{package}:{kind}:{target['name']}"
        binaries.append((name, msg["executable"], manifest.parent, package))
    return binaries


def package_name(msg):
    # package_id is "path+file:///…/provider#tenantry-provider@0.1.0", or
    # "path+file:///…/name#0.1.0" when the folder is named after the package.
    tail = msg["package_id"].rsplit("#", 1)[-1]
    if "@" in tail:
        return tail.split("@", 1)[0]
    return Path(msg["manifest_path"]).parent.name


def load_durations():
    durations = {}
    if DURATIONS.exists():
        for line in DURATIONS.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 2:
                try:
                    durations[parts[0]] = float(parts[1])
                except ValueError:
                    pass
    return durations


def save_durations(durations, results):
    for name, (_, seconds) in results.items():
        durations[name] = seconds
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = DURATIONS.with_suffix(".partial")
    tmp.write_text("".join(f"{n}\t{s:.1f}\n" for n, s in sorted(durations.items())))
    tmp.replace(DURATIONS)


class Job:
    def __init__(self, name, argv, cwd, env):
        self.name, self.argv, self.cwd, self.env = name, argv, cwd, env
        self.proc = None
        self.log = tempfile.TemporaryFile(mode="w+")
        self.started = self.ended = None

    def start(self):
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, cwd=self.cwd, env=self.env, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    def stop(self):
        """Stops the job's whole process group: TERM, then KILL after 15 s."""
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def output(self):
        self.log.seek(0)
        return self.log.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "2")))
    parser.add_argument("--deadline-minutes", type=float, default=None)
    parser.add_argument("names", nargs="*")
    args, harness_args = parser.parse_known_args()
    if "--" in sys.argv:
        harness_args = sys.argv[sys.argv.index("--") + 1:]
        args.names = [n for n in args.names if n not in harness_args]

    build_start = time.monotonic()
    binaries = build_test_binaries()
    print(f"run-tests: built {len(binaries)} test binaries in "
          f"{time.monotonic() - build_start:.0f}s", flush=True)

    jobs = []
    for name, exe, cwd, package in binaries:
        if args.names and name not in args.names:
            continue
        env = dict(os.environ, CARGO_MANIFEST_DIR=str(cwd), CARGO_PKG_NAME=package)
        jobs.append(Job(name, [exe, *harness_args], cwd, env))
    if not args.names or "doctests" in args.names:
        jobs.append(Job("doctests", ["cargo", "test", "--workspace", "--locked", "--doc"],
                        ROOT, dict(os.environ)))
    if args.names:
        unknown = set(args.names) - {j.name for j in jobs}
        if unknown:
            sys.exit(f"run-tests: no test binary named {', '.join(sorted(unknown))}")

    durations = load_durations()
    jobs.sort(key=lambda j: -durations.get(j.name, float("inf")))

    deadline = None
    if args.deadline_minutes:
        deadline = time.monotonic() + args.deadline_minutes * 60
    results, pending, running = {}, list(jobs), []
    run_start = time.monotonic()
    timed_out = False
    while pending or running:
        while pending and len(running) < max(1, args.jobs) and not timed_out:
            job = pending.pop(0)
            print(f"run-tests: start {job.name}", flush=True)
            job.start()
            running.append(job)
        time.sleep(0.5)
        if deadline and time.monotonic() > deadline and not timed_out:
            timed_out = True
            print(f"run-tests: deadline of {args.deadline_minutes} min passed; "
                  f"stopping {', '.join(j.name for j in running)}", flush=True)
            for job in running:
                job.stop()
        for job in list(running):
            if job.proc.poll() is None:
                continue
            running.remove(job)
            job.ended = time.monotonic()
            seconds = job.ended - job.started
            status = "ok" if job.proc.returncode == 0 else f"FAILED ({job.proc.returncode})"
            results[job.name] = (status, seconds)
            print(f"\n===== {job.name}: {status} in {seconds:.0f}s =====", flush=True)
            sys.stdout.write(job.output())
            sys.stdout.flush()

    save_durations(durations, {n: r for n, r in results.items() if r[0] == "ok"})
    print(f"\nrun-tests: {len(results)} binaries in {time.monotonic() - run_start:.0f}s "
          f"({args.jobs} at a time)")
    print(f"{'binary':<40} {'seconds':>8}  result")
    for name, (status, seconds) in sorted(results.items(), key=lambda r: -r[1][1]):
        print(f"{name:<40} {seconds:>8.0f}  {status}")
    failed = [n for n, (s, _) in results.items() if s != "ok"]
    skipped = [j.name for j in pending]
    if skipped:
        print(f"not started (deadline): {', '.join(skipped)}")
    if failed or skipped or timed_out:
        sys.exit(1)


if __name__ == "__main__":
    main()
