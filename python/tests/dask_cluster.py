"""A real Dask cluster on 127.0.0.1 for tests and benchmarks: one
``dask-scheduler`` and named ``dask-worker`` processes, started from this
Python (``sys.executable -m distributed.cli...``, so that the workers run the
interpreter, torch and stoker the caller runs) and stopped with nothing left.

    with DaskCluster(tmp_path, workers=2, pythonpath=[...]) as cluster:
        client = distributed.Client(cluster.address, security=cluster.security())
        cluster.kill_worker("worker-0")      # SIGKILL
        cluster.add_worker(env={"X": "1"})   # a new one, its own environment
        cluster.stop_scheduler()
    # close() (here: leaving the block) stops every process it started and
    # raises AssertionError if one of them, or one of their ports, is left.

Every process binds 127.0.0.1 only (checked on its listening sockets once it
is up), has no dashboard and, for a worker, one thread and no nanny: a worker
is one process, so SIGKILL ends the worker itself, as a machine that dies
would. Each runs in a session of its own, so that stopping it also stops what
it forked. A worker finds its own name in $STOKER_TEST_WORKER, so that code
it runs can tell where it runs without asking Dask. Logs go to
``<folder>/<name>.log``; a process that does not come up in time raises
RuntimeError with the end of its log.

``make_tls_files(folder)`` writes a CA and one certificate for 127.0.0.1
(python3-cryptography); ``DaskCluster(..., tls=files)`` then runs everything
over ``tls://`` with mutual authentication, and ``security()`` gives the
client's ``distributed.Security``.
"""

import datetime
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil

WORKER_NAME_ENV = "STOKER_TEST_WORKER"  # each worker's --name, in its environment

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # a cold import of distributed on a loaded 2-core machine
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this
POLL_S = 0.02
# Without a dashboard, a scheduler or worker still serves HTTP (health,
# metrics) on every interface: on 8787 for the scheduler. Keep it on loopback.
_NO_DASHBOARD = ("--no-dashboard", "--dashboard-address", f"{HOST}:0")


class TlsFiles:
    """Paths of a CA certificate and of a certificate + key it signed."""

    def __init__(self, ca, cert, key):
        self.ca, self.cert, self.key = ca, cert, key


def make_tls_files(folder):
    """Writes ca.pem, cert.pem and key.pem into `folder`: a CA made now and a
    certificate for 127.0.0.1 (server and client use), valid for a day.
    Returns TlsFiles."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    os.makedirs(folder, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def builder(subject, issuer, public_key):
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def name(common):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (builder(name("stoker test CA"), name("stoker test CA"), ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (builder(name(HOST), ca.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(*(os.path.join(folder, f) for f in ("ca.pem", "cert.pem", "key.pem")))
    for path, data in ((files.ca, ca.public_bytes(serialization.Encoding.PEM)),
                       (files.cert, cert.public_bytes(serialization.Encoding.PEM))):
        with open(path, "wb") as f:
            f.write(data)
    fd = os.open(files.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return files


class _Process:
    """One process the cluster started: its Popen, log, and listening ports."""

    def __init__(self, name, popen, log_path):
        self.name, self.popen, self.log_path = name, popen, log_path
        self.ports = []  # its listening TCP ports, once it is up
        self.address = None  # a worker's, once it is up

    def log_tail(self, chars=3000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError as e:
            return f"(no log: {e})"

    def check_alive(self, what):
        if self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode} {what}; "
                               f"its log ({self.log_path}) ends:\n{self.log_tail()}")

    def record_sockets(self):
        """Reads its listening sockets; each must be bound to 127.0.0.1 alone."""
        listening = [c for c in psutil.Process(self.popen.pid).connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        wide = [c.laddr for c in listening if c.laddr.ip != HOST]
        if wide:
            raise AssertionError(f"{self.name} listens beyond {HOST}: {wide}")
        self.ports = sorted(c.laddr.port for c in listening)


def _session_pids(sid):
    """The pids whose session is `sid` (a process started with
    start_new_session=True leads the session of its own pid), alive now."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (OSError, psutil.Error):
            pass  # exited meanwhile
    return found


def port_open(port):
    """True when something accepts connections on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect((HOST, port))
        except OSError:
            return False
        return True


class DaskCluster:
    """A dask-scheduler and named dask-worker processes on 127.0.0.1.

    folder: where the scheduler file, logs and worker directories go.
    workers: the workers start() starts: a count (named worker-0, worker-1,
        ...) or {name: env added for that one, or None}.
    pythonpath: folders put first on every process's PYTHONPATH (the stoker
        build's python folder, the modules that define the datasets).
    tls: TlsFiles to run over tls:// with them, or None for tcp://.
    preload: modules each worker imports before it registers (--preload).
    cpus: CPUs every process is confined to (taskset), or None.
    env: variables set for every process.

    Not thread-safe: one thread drives it. close() is idempotent.
    """

    def __init__(self, folder, *, workers=2, pythonpath=(), tls=None, preload=(), cpus=None,
                 env=None, start_timeout=START_TIMEOUT_S):
        self.folder = os.fspath(folder)
        self._initial_workers = workers
        self._pythonpath = [os.path.abspath(p) for p in pythonpath]
        self._tls = tls
        self._preload = list(preload)
        self._cpus = None if cpus is None else sorted(cpus)
        self._env = dict(env or {})
        self._start_timeout = start_timeout
        self._scheduler = None
        self._workers = {}  # name -> _Process, in start order
        self._gone = []  # processes killed or stopped before close(), checked again there
        self._next_worker = 0
        self.address = None
        self._closed = False

    # --- starting -----------------------------------------------------------

    def start(self):
        """Starts the scheduler, then the workers, and waits until every
        worker is registered. Returns self."""
        os.makedirs(self.folder, exist_ok=True)
        try:
            self._start_scheduler()
            self.add_workers(self._initial_workers)
        except BaseException:
            self.close(check=False)
            raise
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        # A failure inside the block is the one to report: clean up quietly then.
        self.close(check=exc[0] is None)

    def _environment(self, extra):
        env = dict(os.environ)
        paths = self._pythonpath + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        # Fail fast instead of retrying for Dask's default 30 s.
        env.setdefault("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "10s")
        env.update(self._env)
        env.update(extra)
        return env

    def _tls_args(self):
        if self._tls is None:
            return []
        return ["--protocol", "tls", "--tls-ca-file", self._tls.ca, "--tls-cert", self._tls.cert,
                "--tls-key", self._tls.key]

    def _popen(self, name, module, args, env, cpus):
        log_path = os.path.join(self.folder, f"{name}.log")
        cmd = [sys.executable, "-m", module, *args]
        cpus = self._cpus if cpus is None else sorted(cpus)
        if cpus is not None:
            # taskset execs the command: the pid stays the process's own, and
            # every thread it starts inherits the CPUs (a preexec_fn is not
            # safe in a process that runs threads, as a loader's does).
            cmd = ["taskset", "-c", ",".join(str(c) for c in cpus), *cmd]
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, env=self._environment(env),
                                     cwd=self.folder, start_new_session=True)
        return _Process(name, popen, log_path)

    def _start_scheduler(self):
        scheduler_file = os.path.join(self.folder, "scheduler.json")
        if os.path.exists(scheduler_file):
            os.unlink(scheduler_file)
        self._scheduler = self._popen(
            "scheduler", "distributed.cli.dask_scheduler",
            ["--host", HOST, "--port", "0", *_NO_DASHBOARD, "--no-show",
             "--scheduler-file", scheduler_file, *self._tls_args()], {}, None)
        deadline = time.monotonic() + self._start_timeout
        while True:
            self._scheduler.check_alive("before it wrote its address")
            try:
                with open(scheduler_file) as f:
                    self.address = json.load(f)["address"]
                break
            except (OSError, ValueError, KeyError):
                pass  # not written yet, or written half
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler wrote no address in {self._start_timeout} s; "
                                   f"its log ends:\n{self._scheduler.log_tail()}")
            time.sleep(POLL_S)
        self._scheduler.record_sockets()

    def _launch_worker(self, name, env, cpus, cold=False):
        # A name is never reused: its log and folder stay the first one's.
        used = set(self._workers) | {p.name for p in self._gone}
        if name is None:
            while f"worker-{self._next_worker}" in used:
                self._next_worker += 1
            name = f"worker-{self._next_worker}"
        if name in used:
            raise ValueError(f"a worker named {name!r} was started already")
        preload = [] if cold else [a for module in self._preload for a in ("--preload", module)]
        tls = self._tls_args()
        self._workers[name] = self._popen(
            name, "distributed.cli.dask_worker",
            [self.address, "--name", name, "--host", HOST, *_NO_DASHBOARD, "--nthreads", "1",
             "--no-nanny", "--memory-limit", "0", "--death-timeout", "10",
             "--local-directory", os.path.join(self.folder, name), *preload, *tls],
            {WORKER_NAME_ENV: name, **env}, cpus)
        return name

    def _wait_for_log(self, process, text, what):
        """Waits until `text` is in the process's log; RuntimeError naming
        `what` if the process exits first or START_TIMEOUT_S passes."""
        deadline = time.monotonic() + self._start_timeout
        while text not in process.log_tail(chars=10**7):
            process.check_alive(f"before it {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{process.name} did not {what} in {self._start_timeout} s; "
                                   f"its log ends:\n{process.log_tail()}")
            time.sleep(POLL_S)

    def _wait_registered(self, process):
        self._wait_for_log(process, "Registered to:", "registered with the scheduler")
        started = re.search(r"Start worker at:\s*(\S+)", process.log_tail(chars=10**7))
        process.address = started and started.group(1)
        process.record_sockets()

    def add_worker(self, name=None, *, env=None, cpus=None, cold=False):
        """Starts one more worker (named `name`, else the next worker-N), with
        `env` added to its environment and on `cpus` if given, and waits until
        it is registered; `cold`: without the preloads (its first task
        imports stoker and torch, as a worker started beside a job's). Returns
        its name."""
        return self.add_workers({name: env}, cpus=cpus, cold=cold)[0]

    def add_workers(self, workers, *, cpus=None, cold=False):
        """Starts workers side by side and waits until all are registered:
        `workers` is a count (named worker-N) or {name: env or None}. Returns
        their names."""
        specs = [(None, None)] * workers if isinstance(workers, int) else list(workers.items())
        names = []
        try:
            for name, env in specs:
                names.append(self._launch_worker(name, dict(env or {}), cpus, cold))
            for name in names:
                self._wait_registered(self._workers[name])
        except BaseException:
            self._end([self._workers.pop(name) for name in names], signal.SIGKILL)
            raise
        return names

    # --- what it is ------------------------------------------------------------

    def security(self):
        """The client's distributed.Security: TLS with this cluster's CA and
        certificate, or None over tcp://."""
        if self._tls is None:
            return None
        from distributed import Security

        return Security(tls_ca_file=self._tls.ca, tls_client_cert=self._tls.cert,
                        tls_client_key=self._tls.key, require_encryption=True)

    @property
    def tls(self):
        """The TlsFiles it runs with, or None."""
        return self._tls

    @property
    def worker_names(self):
        """Names of the workers this cluster started that are still running."""
        return list(self._workers)

    def worker_address(self, name):
        """Worker `name`'s address, as the scheduler knows it ("tcp://127.0.0.1:PORT")."""
        return self._workers[name].address

    def pid(self, name):
        """The pid of worker `name`, or of the scheduler for "scheduler"."""
        return (self._scheduler if name == "scheduler" else self._workers[name]).popen.pid

    def ports(self):
        """Every listening port of the scheduler and the workers, as seen when
        each came up."""
        return sorted(p for proc in self._all() for p in proc.ports)

    def _all(self):
        procs = [self._scheduler] if self._scheduler else []
        return procs + list(self._workers.values()) + self._gone

    # --- stopping -------------------------------------------------------------

    def kill_worker(self, name):
        """SIGKILLs worker `name` (and anything it forked), waits for it, and
        then until the scheduler (if it runs) has removed it: a test that
        asks the scheduler next finds it gone."""
        process = self._workers.pop(name)
        self._end([process], signal.SIGKILL)
        self._gone.append(process)
        if self._scheduler is not None and process.address:
            self._wait_for_log(self._scheduler, f"Remove worker <WorkerState '{process.address}'",
                               f"removed {name}")

    def stop_scheduler(self, sig=signal.SIGKILL):
        """Sends `sig` to the scheduler (SIGKILL: gone without a word; SIGTERM:
        it closes and tells the others) and waits until it has exited. The
        workers are left to notice by themselves."""
        process, self._scheduler = self._scheduler, None
        self._end([process], sig)
        self._gone.append(process)

    @staticmethod
    def _end(processes, sig):
        """Sends `sig` to each process's session, waits for them (up to
        STOP_GRACE_S after a SIGTERM, then SIGKILL), and reaps them."""
        for p in processes:
            _signal_session(p, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in processes:
            try:
                p.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_session(p, signal.SIGKILL)
                p.popen.wait(timeout=10)
        # Whatever they forked, and which may outlive them in their session.
        for p in processes:
            _signal_session(p, signal.SIGKILL, leader_too=False)

    def close(self, check=True):
        """Stops the workers, the scheduler and what they forked (SIGKILL).
        With `check`, then raises AssertionError naming every process still
        alive and every port still accepting connections."""
        if self._closed:
            return
        self._closed = True
        # All at once, and SIGKILL: they hold nothing a graceful exit would
        # save (their folders are the caller's to remove), and a worker's
        # graceful close takes a second or two, which adds up over a suite.
        running = list(self._workers.values()) + ([self._scheduler] if self._scheduler else [])
        self._workers, self._scheduler = {}, None
        self._end(running, signal.SIGKILL)
        self._gone += running
        if check:
            self.check_nothing_left()

    def check_nothing_left(self):
        """Raises AssertionError when a process this cluster started, or one
        in its session (what it forked), is alive, or one of their ports
        accepts connections."""
        left = []
        for p in self._gone:
            if p.popen.poll() is None:
                left.append(f"{p.name} (pid {p.popen.pid})")
            left += [f"pid {pid} in {p.name}'s session" for pid in _session_pids(p.popen.pid)
                     if pid != p.popen.pid]
        open_ports = [port for port in self.ports() if port_open(port)]
        if left or open_ports:
            raise AssertionError(f"the Dask cluster left processes {left} and "
                                 f"listening ports {open_ports}")


def _signal_session(process, sig, leader_too=True):
    """Sends `sig` to the process group the process leads (its session: the
    pgid of a session leader is its pid), or only to the others in it."""
    pid = process.popen.pid
    if leader_too:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        return
    for other in _session_pids(pid):
        if other != pid:
            try:
                os.kill(other, sig)
            except ProcessLookupError:
                pass
