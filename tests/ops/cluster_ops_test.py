#!/usr/bin/env python3
"""Operations behaviour of a real local cluster (`deltaserve serve`, tiny model, CPU):

  security  missing / wrong bearer tokens are refused with UNAUTHENTICATED on the public API, the
            admin API takes only its own token, and nothing of the cluster listens on a
            non-loopback address by default (/proc/net/tcp{,6} of every cluster process);
  logs      every line the roles write is one logfmt event; finished requests carry request_id;
  stop      SIGTERM to the gateway lets an in-flight request finish (graceful stop);
  systemd   each role started on its own with $NOTIFY_SOCKET / $WATCHDOG_USEC (what systemd gives a
            Type=notify unit) sends READY=1 (the worker only after its warmup) and WATCHDOG=1 pings.

  configs   deploy/config/*.conf start their roles; a typo or bad value in a config file stops
            the role with an error naming the file and line.

usage: cluster_ops_test.py --deltaserve BIN --deltactl BIN [--src DIR]
"""
import argparse
import calendar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_cluster as oc  # noqa: E402

TOKEN = "public-token-0123456789abcdef0123"
ADMIN = "admin-token-0123456789abcdef01234"
WRONG = "wrong-token-0123456789abcdef012345"
failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def deltactl(a, *args, timeout=60):
    return subprocess.run([a.deltactl, *args], capture_output=True, text=True, timeout=timeout)


# deltactl prints failures as "deltactl: [request id] CODE_NAME: message".
GRPC_CODES = {"CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
              "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7,
              "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10,
              "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
              "DATA_LOSS": 15, "UNAUTHENTICATED": 16}


def grpc_code(r):
    m = re.search(r"deltactl: (?:\[[^\]]*\] )?([A-Z_]+): ", r.stderr + r.stdout)
    if m and m.group(1) in GRPC_CODES:
        return GRPC_CODES[m.group(1)]
    return 0 if r.returncode == 0 else None


def listening_sockets(pid):
    """(address, port) of every TCP socket in LISTEN state owned by `pid`."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", t)
        if m:
            inodes.add(m.group(1))
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if state != "0A" or inode not in inodes:  # 0A = TCP_LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            if v6:
                # Four little-endian 32-bit words.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                addr = socket.inet_ntop(socket.AF_INET6, raw)
            else:
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            out.append((addr, int(hexport, 16)))
    return out


def is_loopback(addr):
    return addr.startswith("127.") or addr == "::1" or addr.startswith("::ffff:127.")


def logfmt_ok(line):
    return re.fullmatch(r'ts=\S+ level=(debug|info|warning|error) component=\S+ event=\S+'
                        r'( [A-Za-z0-9_.-]+=("([^"\\]|\\.)*"|[^ "]+))*', line) is not None


def test_cluster(a, work):
    keys = os.path.join(work, "api-keys")
    admin_keys = os.path.join(work, "admin-keys")
    for path, tok in ((keys, TOKEN), (admin_keys, ADMIN)):
        with open(path, "w") as f:
            f.write(tok + "\n")
        os.chmod(path, 0o600)
    c = oc.Cluster(a.deltaserve, work, ctx=8192, slots=2,
                   extra_args=["--api-key-file", keys, "--admin-key-file", admin_keys])
    try:
        c.wait_serving()
        gen = ["generate", "--addr", c.addr, "--prompt-ids", "1,2,3", "--max-tokens", "4",
               "--ignore-eos", "--timeout", "30"]
        r = deltactl(a, *gen)
        expect(grpc_code(r) == 16, f"public API without a token: UNAUTHENTICATED (got {grpc_code(r)})")
        r = deltactl(a, *gen, "--api-key", WRONG)
        expect(grpc_code(r) == 16, f"public API with a wrong token: UNAUTHENTICATED (got {grpc_code(r)})")
        r = deltactl(a, *gen, "--api-key", ADMIN)
        expect(grpc_code(r) == 16, f"public API with the admin token: UNAUTHENTICATED (got {grpc_code(r)})")
        r = deltactl(a, *gen, "--api-key", TOKEN, "--request-id", "ops-req-1")
        expect(r.returncode == 0, f"public API with its token: OK ({r.stderr.strip()[:200]})")
        r = deltactl(a, "status", "--admin-addr", c.admin_addr, "--api-key", TOKEN)
        expect(grpc_code(r) == 16, f"admin API with the public token: UNAUTHENTICATED (got {grpc_code(r)})")
        r = deltactl(a, "status", "--admin-addr", c.admin_addr)
        expect(grpc_code(r) == 16, f"admin API without a token: UNAUTHENTICATED (got {grpc_code(r)})")
        r = deltactl(a, "status", "--admin-addr", c.admin_addr, "--api-key", ADMIN)
        expect(r.returncode == 0 and "serving: yes" in r.stdout,
               f"admin API with its token: OK ({r.stderr.strip()[:200]})")

        # Nothing listens on a public address by default.
        pids = dict(c.pids, serve=c.proc.pid)
        n = 0
        for role, pid in pids.items():
            for addr, port in listening_sockets(pid):
                n += 1
                expect(is_loopback(addr), f"{role} listens on {addr}:{port} (loopback only)")
        expect(n >= 6, f"found the cluster's listeners ({n}: gateway public/admin/metrics, "
                       "scheduler internal/metrics, worker metrics)")

        # Graceful stop: a long request in flight when the gateway gets SIGTERM still finishes.
        # SIGTERM goes out as soon as the stream's first text arrives; 2000 tokens then take
        # ~0.8 s on an idle 2-core VM (tiny model, ~0.4 ms/token) and ~4 s at 2 ms/token under
        # load: still running at the signal, and inside the 5 s drain of `deltaserve serve`.
        long_req = ["generate", "--addr", c.addr, "--prompt-ids", "5,6,7", "--max-tokens", "2000",
                    "--ignore-eos", "--timeout", "120", "--api-key", TOKEN,
                    "--request-id", "ops-graceful"]
        t0 = time.time()
        p = subprocess.Popen([a.deltactl, *long_req], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        p.stdout.read(1)  # the stream has started
        expect(p.poll() is None, "the long request is still running when SIGTERM is sent")
        os.kill(c.pids["gateway"], signal.SIGTERM)
        time.sleep(0.3)
        r = deltactl(a, *gen, "--api-key", TOKEN)
        expect(grpc_code(r) == 14, f"a new request after SIGTERM is refused with UNAVAILABLE "
                                   f"(got {grpc_code(r)})")
        out, err = p.communicate(timeout=180)
        expect(p.returncode == 0, f"the in-flight request finished after SIGTERM "
                                  f"({time.time() - t0:.1f} s; {err.strip()[:200]})")
    finally:
        c.stop()
    lines = [l for l in open(c.stderr_path).read().splitlines() if l.startswith("ts=")]
    bad = [l for l in lines if not logfmt_ok(l)]
    expect(len(lines) > 5 and not bad, f"{len(lines)} log lines, all logfmt" +
           (f"; first bad: {bad[0]}" if bad else ""))
    for comp in ("gateway", "scheduler", "worker"):
        expect(any(f"component={comp} " in l for l in lines), f"{comp} logs structured events")
    fin = [l for l in lines if "event=request_finished" in l]
    expect(any("request_id=ops-req-1" in l and "outcome=success" in l for l in fin),
           "request_finished carries the client's request_id and its outcome")
    expect(any("request_id=ops-graceful" in l and "outcome=success" in l for l in fin),
           "the request in flight during the graceful stop finished with outcome=success")
    expect(any("outcome=unauthenticated" in l for l in fin), "refused requests are logged")


class FakeSystemd:
    """The notify socket systemd gives a Type=notify service."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.msgs = []  # (time, text)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            self.msgs.append((time.time(), data.decode()))

    def first(self, needle):
        for t, m in self.msgs:
            if needle in m:
                return t
        return None

    def count(self, needle):
        return sum(1 for _, m in self.msgs if needle in m)

    def close(self):
        self.sock.close()


def wait_for(cond, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


def stop_all(procs, sockets):
    """SIGTERM every live process, wait up to 20 s each (then kill), close the notify sockets."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    for s in sockets:
        s.close()


def test_systemd(a, work):
    model = os.path.join(work, "tiny.gguf")
    procs = []
    sd = {}

    def start(role, args):
        sd[role] = FakeSystemd(os.path.join(work, f"{role}.notify"))
        env = dict(os.environ, NOTIFY_SOCKET=sd[role].path, WATCHDOG_USEC="2000000")
        errf = open(os.path.join(work, f"{role}.stderr"), "w")
        # No WATCHDOG_PID: sd_watchdog_enabled() then accepts the variable in any process.
        p = subprocess.Popen([a.deltaserve, role, *args], env=env, stdout=subprocess.DEVNULL,
                             stderr=errf)
        procs.append(p)
        return p

    try:
        port_file = os.path.join(work, "sched.port")
        sched = start("scheduler", ["--listen", "127.0.0.1:0", "--port-file", port_file,
                                    "--slots", "2", "--ctx", "1024"])
        expect(wait_for(lambda: os.path.exists(port_file), 30), "scheduler wrote its port")
        expect(wait_for(lambda: sd["scheduler"].first("READY=1"), 10), "scheduler: READY=1")
        sched_addr = "127.0.0.1:" + open(port_file).read().split()[0]
        worker = start("worker", ["--scheduler", sched_addr, "--model", model, "--backend", "cpu",
                                  "--threads", "2", "--worker-id", "sd-test-gpu0"])
        expect(wait_for(lambda: sd["worker"].first("READY=1"), 120), "worker: READY=1")
        # READY only after the warmup: the worker's log has warmup_done before READY arrived.
        wlog = open(os.path.join(work, "worker.stderr")).read()
        m = re.search(r"ts=(\S+) [^\n]*event=warmup_done", wlog)
        expect(m is not None, "worker logged event=warmup_done")
        if m:
            warm = calendar.timegm(time.strptime(m.group(1)[:19], "%Y-%m-%dT%H:%M:%S")) + \
                float("0." + m.group(1)[20:26])
            expect(sd["worker"].first("READY=1") >= warm - 0.001,
                   "worker: READY=1 came after its warmup generation")
        expect(sd["worker"].first("STATUS=") is not None, "worker: STATUS= while starting")
        gw_ports = os.path.join(work, "gw.port")
        gw = start("gateway", ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                               "--scheduler", sched_addr, "--model", model, "--port-file", gw_ports])
        expect(wait_for(lambda: sd["gateway"].first("READY=1"), 30), "gateway: READY=1")
        time.sleep(3.5)  # WATCHDOG_USEC=2s: pings every second
        for role in ("scheduler", "worker", "gateway"):
            n = sd[role].count("WATCHDOG=1")
            expect(n >= 2, f"{role}: WATCHDOG=1 pings from its live loops ({n} in ~3 s)")
        gw.send_signal(signal.SIGTERM)
        expect(wait_for(lambda: sd["gateway"].first("STOPPING=1"), 10), "gateway: STOPPING=1 on SIGTERM")
        expect(gw.wait(30) == 0, "gateway exits 0 after a graceful stop")
        # A stopped (SIGSTOP) scheduler sends no pings: systemd would kill and restart it.
        before = sd["scheduler"].count("WATCHDOG=1")
        sched.send_signal(signal.SIGSTOP)
        time.sleep(2.5)
        expect(sd["scheduler"].count("WATCHDOG=1") == before, "a frozen scheduler stops pinging")
        sched.send_signal(signal.SIGCONT)
    finally:
        stop_all(procs, sd.values())


def test_bad_config(a, work):
    conf = os.path.join(work, "bad-gateway.conf")
    with open(conf, "w") as f:
        f.write("# gateway\nmodel = /nonexistent.gguf\nscheduler = 127.0.0.1:1\nmax_inflght = 3\n")
    r = subprocess.run([a.deltaserve, "gateway", "--config", conf], capture_output=True, text=True,
                       timeout=30)
    expect(r.returncode == 2 and f"{conf}:4: unknown key 'max_inflght'" in r.stderr,
           f"a config typo stops the gateway naming file and line ({r.stderr.strip()[:200]})")
    with open(conf, "w") as f:
        f.write("slots = many\n")
    r = subprocess.run([a.deltaserve, "scheduler", "--config", conf], capture_output=True,
                       text=True, timeout=30)
    expect(r.returncode == 2 and f"{conf}:1: key 'slots'" in r.stderr,
           f"a bad value stops the scheduler naming file and line ({r.stderr.strip()[:200]})")


def test_shipped_configs(a, work):
    """deploy/config/*.conf are valid for their roles: each role starts from its file (paths and
    ports overridden on the command line, which the file format allows) and reaches READY."""
    conf = os.path.join(a.src, "deploy", "config")
    model = os.path.join(work, "tiny.gguf")
    keys = os.path.join(work, "cfg-keys")
    with open(keys, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(keys, 0o600)
    procs, sd = [], {}

    def start(role, args):
        sd[role] = FakeSystemd(os.path.join(work, f"cfg-{role}.notify"))
        env = dict(os.environ, NOTIFY_SOCKET=sd[role].path)
        p = subprocess.Popen([a.deltaserve, role, "--config", os.path.join(conf, f"{role}.conf"),
                              *args], env=env, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(work, f"cfg-{role}.stderr"), "w"))
        procs.append(p)
        return p

    try:
        pf = os.path.join(work, "cfg-sched.port")
        start("scheduler", ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                            "--port-file", pf, "--ctx", "1024", "--slots", "2",
                            "--internal-key-file", keys])
        expect(wait_for(lambda: sd["scheduler"].first("READY=1"), 30),
               "scheduler starts from deploy/config/scheduler.conf")
        sched = "127.0.0.1:" + open(pf).read().split()[0]
        start("worker", ["--scheduler", sched, "--model", model, "--backend", "cpu",
                         "--threads", "2", "--metrics-listen", "127.0.0.1:0",
                         "--scheduler-key-file", keys])
        expect(wait_for(lambda: sd["worker"].first("READY=1"), 120),
               "worker starts from deploy/config/worker.conf")
        start("gateway", ["--scheduler", sched, "--model", model, "--listen", "127.0.0.1:0",
                          "--admin-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                          "--api-key-file", keys, "--admin-key-file", keys,
                          "--scheduler-key-file", keys])
        expect(wait_for(lambda: sd["gateway"].first("READY=1"), 30),
               "gateway starts from deploy/config/gateway.conf")
    finally:
        stop_all(procs, sd.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltaserve", required=True)
    ap.add_argument("--deltactl", required=True)
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ds-ops-")
    try:
        test_bad_config(a, work)
        test_cluster(a, work)
        test_systemd(a, work)
        test_shipped_configs(a, work)
    finally:
        if failures:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("cluster_ops_test: OK")


if __name__ == "__main__":
    main()
