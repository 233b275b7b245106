"""Helpers of the operations tests that drive a real local cluster (`deltaserve serve`).

Standard library only: these run in CI next to Debian's prometheus/promtool.
"""
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_nvml_present():
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


class Cluster:
    """`deltaserve serve` on a tiny synthesized model, loopback ports picked by the cluster."""

    def __init__(self, deltaserve, workdir, extra_args=(), env=None, slots=4, ctx=2048):
        self.deltaserve = deltaserve
        self.workdir = workdir
        self.model = os.path.join(workdir, "tiny.gguf")
        if not os.path.exists(self.model):
            subprocess.run([deltaserve, "gguf-synth", "--preset", "tiny", "--out", self.model],
                           check=True, stdout=subprocess.DEVNULL)
        self.stderr_path = os.path.join(workdir, "serve.stderr")
        self.stderr = open(self.stderr_path, "w")
        args = [deltaserve, "serve", "--model", self.model, "--port", "0", "--metrics-port", "0",
                "--slots", str(slots), "--ctx", str(ctx), "--backend", "cpu", "--threads", "2",
                *extra_args]
        log("starting: " + " ".join(args))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=env, start_new_session=True)
        self.banner = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.banner.append(line.rstrip("\n"))
            if line.startswith("deltaserve serve: ^C"):
                self._ready.set()
        self._ready.set()

    def wait_serving(self, timeout=120):
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("cluster did not start:\n" + "\n".join(self.banner) + "\n" +
                               open(self.stderr_path).read()[-4000:])
        text = "\n".join(self.banner)
        self.addr = re.search(r"generation\s+(\S+)", text).group(1)
        self.admin_addr = re.search(r"admin\s+(\S+)", text).group(1)
        self.scheduler_addr = re.search(r"scheduler\s+(127\.0\.0\.1:\d+)", text).group(1)
        pids = re.search(r"pids\s+scheduler (\d+), worker (\d+), gateway (\d+)", text)
        self.pids = {"scheduler": int(pids.group(1)), "worker": int(pids.group(2)),
                     "gateway": int(pids.group(3))}
        m = re.search(r"metrics\s+(.*)", text)
        if not m:
            raise RuntimeError("serve printed no metrics line:\n" + text)
        self.metrics = dict(re.findall(r"(gateway|scheduler|worker) (\S+:\d+)", m.group(1)))
        log(f"cluster serving: {self.addr}, admin {self.admin_addr}, metrics {self.metrics}")
        return self

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.stderr.close()
        return self.proc.returncode


class LoadLoop:
    """Runs `deltactl load` rounds back to back until stopped (plus optional bad-token calls)."""

    def __init__(self, deltactl, addr, api_key=None, bad_key=None, concurrency=4):
        self.deltactl, self.addr = deltactl, addr
        self.api_key, self.bad_key, self.concurrency = api_key, bad_key, concurrency
        self.rounds = 0
        self.failures = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _load(self, key, requests):
        args = [self.deltactl, "load", "--addr", self.addr, "--concurrency",
                str(self.concurrency), "--requests", str(requests), "--prompt-len", "24",
                "--max-tokens", "24", "--timeout", "60"]
        if key:
            args += ["--api-key", key]
        return subprocess.run(args, capture_output=True, text=True, timeout=300)

    def _run(self):
        while not self._stop.is_set():
            r = self._load(self.api_key, 32)
            self.rounds += 1
            if r.returncode != 0:
                self.failures.append(r.stdout + r.stderr)
            if self.bad_key:
                self._load(self.bad_key, 4)  # refused: counted as outcome=unauthenticated

    def stop(self):
        self._stop.set()
        self._t.join(timeout=120)


class Prometheus:
    def __init__(self, workdir, config_text):
        self.port = free_port()
        self.config = os.path.join(workdir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(workdir, "prometheus.log")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"), start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=2)
                return
            except Exception:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.3)
        raise RuntimeError("prometheus did not start: " + open(self.log_path).read()[-3000:])

    def api(self, path, **params):
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{q}", timeout=30) as r:
            return json.load(r)

    def query(self, expr):
        return self.api("query", query=expr)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ---- PromQL expressions -------------------------------------------------------------------------

def _top_level_spans(expr):
    """Yields (index, char) of characters outside (), [], {} and quotes."""
    depth, quote, i = 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            yield i, c
        i += 1


def _strip_parens(e):
    e = e.strip()
    while e.startswith("(") and e.endswith(")"):
        depth = 0
        for i, c in enumerate(e):
            depth += c == "("
            depth -= c == ")"
            if depth == 0 and i < len(e) - 1:
                return e
        e = e[1:-1].strip()
    return e


def split_set_ops(expr):
    """Splits at top-level `and` / `or` / `unless` (the terms of a multi-window alert)."""
    cuts, prev = [], 0
    s = expr
    for i, _ in _top_level_spans(s):
        for op in ("and", "or", "unless"):
            if (s.startswith(op, i) and (i == 0 or not (s[i - 1].isalnum() or s[i - 1] in "_:"))
                    and i + len(op) < len(s) and not (s[i + len(op)].isalnum() or s[i + len(op)] in "_:")):
                # `or` inside a name like `error` cannot match: the checks above need word edges.
                cuts.append((i, len(op)))
    if not cuts:
        return [expr]
    parts = []
    for i, n in cuts:
        parts.append(s[prev:i])
        prev = i + n
    parts.append(s[prev:])
    return [p.strip() for p in parts if p.strip()]


def strip_comparison(expr):
    """`x / y > 0.9` -> `x / y`: the series an alert's threshold is applied to."""
    chars = list(_top_level_spans(expr))
    for k, (i, c) in enumerate(chars):
        two = expr[i:i + 2]
        if two in ("==", "!=", ">=", "<="):
            return expr[:i].strip()
        if c in "<>" and two not in ("<=", ">="):
            return expr[:i].strip()
    return expr.strip()


def alert_terms(expr):
    """The series behind an alert expression: every set-operation term without its threshold."""
    return [_strip_parens(strip_comparison(_strip_parens(t))) for t in split_set_ops(expr)]


def has_data(result):
    """A successful instant query with at least one sample that is a number (not NaN)."""
    if result.get("status") != "success":
        return False, result.get("error", "query failed")
    data = result["data"]
    if data["resultType"] == "scalar":
        v = data["result"][1]
        return v not in ("NaN",), f"scalar {v}"
    rows = data["result"]
    if not rows:
        return False, "empty result"
    values = [r["value"][1] for r in rows]
    if all(v == "NaN" for v in values):
        return False, f"{len(rows)} series, all NaN"
    return True, f"{len(rows)} series, e.g. {values[0]}"
