"""stoker.DataLoader with remote workers on a Dask cluster (cluster=): a real
dask-scheduler and dask-worker processes on 127.0.0.1, started and stopped by
the fixtures in conftest.py (python/tests/dask_cluster.py), which fail a test
that leaves a process or a listening port behind.

Each loader test reads through a loader with at most one local worker and
remote_min=K (at least K remote slots in use, whatever the tuner says: a
testing knob), and compares what it got, batch for batch, with a loader
without a cluster and without workers given the same generator: the same
samples, exactly once, bit-identical (a batch is seeded by (seed, epoch,
batch) wherever it is made). The dataset (python/tests/remote_datasets.py)
lives in a module the workers import. No test asserts a time.
"""

import gc
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import textwrap
import time
import warnings

import psutil
import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("distributed")
import stoker  # noqa: E402
from dask_cluster import DaskCluster, make_tls_files, port_open  # noqa: E402
from remote_datasets import (GATE_ENV, HANG_ENV, MISSING_THERE, SLOW_ENV,  # noqa: E402
                             STARTED_DIR_ENV, LoadsAtGate, LoadsOnlyHere, Seeded, SeededShards)

BATCH = 8
SEED = 1234
# How long a test waits for something the cluster will do (a remote sample
# to start); far above what it takes, so that only a hang fails.
WAIT_S = 20.0


def make_loader(dataset, **options):
    g = torch.Generator()
    g.manual_seed(SEED)
    return stoker.DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=g, **options)


def remote_loader(dataset, cluster, **options):
    """One local worker at most, and the cluster `cluster` (address or Client)."""
    return make_loader(dataset, num_workers="auto", cluster=cluster, max_workers=1, **options)


def reference(n, epochs=1):
    """Each epoch's batches from a loader without a cluster or workers."""
    with make_loader(Seeded(n), num_workers=0) as dl:
        return [list(dl) for _ in range(epochs)]


def assert_same_epoch(got, want):
    """Batch for batch the same samples and the same values: nothing lost,
    repeated, reordered or seeded otherwise."""
    n = sum(len(b["index"]) for b in want)
    indices = [i for b in got for i in b["index"].tolist()]
    assert sorted(indices) == list(range(n)), "not every sample exactly once"
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g["index"], w["index"]), f"batch {k}: other samples"
        assert torch.equal(g["x"], w["x"]), f"batch {k}: other values (other seeding)"


def remote_sample_started(folder, worker):
    """Whether worker `worker` has started a sample (Seeded logs it in `folder`)."""
    try:
        return os.path.getsize(os.path.join(folder, worker)) > 0
    except OSError:
        return False


class WhenRemoteStarts(threading.Thread):
    """Runs `action` on a thread of its own as soon as worker `worker` has
    started a sample, while the test's thread iterates. join() re-raises
    what the action raised, and fails if it never ran."""

    def __init__(self, folder, worker, action):
        super().__init__(daemon=True)
        self.folder, self.worker, self.action = folder, worker, action
        self.error, self.ran = None, False
        self.start()

    def run(self):
        try:
            deadline = time.monotonic() + WAIT_S
            while not remote_sample_started(self.folder, self.worker):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.worker} started no sample in {WAIT_S} s")
                time.sleep(0.005)
            self.action()
            self.ran = True
        except BaseException as e:  # handed to the test's thread
            self.error = e

    def join(self, timeout=2 * WAIT_S):
        super().join(timeout)
        assert not self.is_alive(), "the action is still running"
        if self.error:
            raise self.error
        assert self.ran


def own_listening_ports():
    """TCP ports this process, and its descendants in its session (stoker's
    zygote and workers; not the clusters', which have sessions of their
    own), listen on."""
    me = psutil.Process()
    procs = [me] + [p for p in me.children(recursive=True) if os.getsid(p.pid) == os.getsid(0)]
    ports = set()
    for p in procs:
        try:
            ports |= {c.laddr.port for c in p.connections("inet")
                      if c.status == psutil.CONN_LISTEN}
        except (psutil.Error, OSError):
            pass  # exited meanwhile
    return ports


# --- the fixture itself ---


@pytest.mark.timeout(60)
def test_a_plain_dask_round_trip_through_the_fixture(shared_dask_cluster):
    cluster = shared_dask_cluster
    with distributed.Client(cluster.address, timeout=10) as client:
        assert client.submit(lambda x: x + 1, 41).result(timeout=10) == 42
        workers = client.scheduler_info()["workers"]
        assert sorted(w["name"] for w in workers.values()) == ["worker-0", "worker-1"]
        assert sorted(workers) == sorted(cluster.worker_address(n) for n in cluster.worker_names)
        assert all(w["nthreads"] == 1 for w in workers.values())
        # The workers run this interpreter and this stoker, and import the
        # tests' modules, so that a dataset defined there unpickles on them.
        facts = client.run(lambda: (sys.executable, sys.modules["stoker"].__file__,
                                    sys.modules["remote_datasets"].__file__))
        here = (sys.executable, stoker.__file__, sys.modules["remote_datasets"].__file__)
        assert list(facts.values()) == [here, here]
        indices = client.submit(lambda ds: [ds[i]["index"] for i in range(3)], Seeded(3))
        assert indices.result(timeout=10) == [0, 1, 2]


@pytest.mark.timeout(60)
def test_the_fixture_kills_adds_and_stops_and_leaves_nothing_behind(tmp_path):
    tests = os.path.dirname(os.path.abspath(__file__))
    cluster = DaskCluster(tmp_path / "c", workers=1, pythonpath=[tests]).start()
    try:
        assert cluster.address.startswith("tcp://127.0.0.1:")
        first_ports = cluster.ports()  # the scheduler's and worker-0's, all up
        assert len(first_ports) >= 3 and all(port_open(p) for p in first_ports)
        victim = cluster.pid("worker-0")
        cluster.kill_worker("worker-0")
        assert not psutil.pid_exists(victim)  # killed and reaped
        assert cluster.add_workers({"worker-1": {"SOME_MARKER": "1"}, None: None}) == [
            "worker-1", "worker-2"]  # worker-0's name is not reused
        pids = [cluster.pid(n) for n in ("scheduler", "worker-1", "worker-2")]
        with distributed.Client(cluster.address, timeout=10) as client:
            marks = client.run(lambda: os.environ.get("SOME_MARKER"))
            assert marks == {cluster.worker_address("worker-1"): "1",
                             cluster.worker_address("worker-2"): None}
        cluster.stop_scheduler()
        assert not psutil.pid_exists(pids[0])
    finally:
        cluster.close()  # raises when a process or port is left
    assert not any(psutil.pid_exists(p) for p in pids)
    assert not any(port_open(p) for p in cluster.ports())


@pytest.mark.timeout(60)
def test_the_tls_fixture_serves_its_certificate_only(dask_tls_cluster, tmp_path):
    cluster = dask_tls_cluster
    assert cluster.address.startswith("tls://127.0.0.1:")
    with distributed.Client(cluster.address, security=cluster.security(), timeout=10) as client:
        assert client.submit(lambda x: 2 * x, 21).result(timeout=10) == 42
    # A client whose certificate another CA signed is turned away at the handshake.
    other = make_tls_files(str(tmp_path / "other"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cluster.tls.ca)
    context.load_cert_chain(other.cert, other.key)
    port = int(cluster.address.rsplit(":", 1)[1])
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw) as s:
                s.recv(1)  # TLS 1.3 says "bad certificate" after the handshake


# --- the loader's remote workers (issue 24) ---------------------------------


@pytest.mark.timeout(60)
def test_remote_batches_are_the_local_ones_exactly_once(shared_dask_cluster):
    n, epochs = 160, 2
    want = reference(n, epochs)
    before = own_listening_ports()
    with remote_loader(Seeded(n, delay_s=0.005), shared_dask_cluster.address,
                       remote_min=1) as dl:
        got = [list(dl) for _ in range(epochs)]
        remote = dl.stats()["remote"]
        # stoker opens no listening socket of its own (nor does its client).
        assert own_listening_ports() <= before
    for g, w in zip(got, want):
        assert_same_epoch(g, w)
    assert set(remote) == {"workers", "peak", "batches", "bytes_per_s", "capacity", "retries",
                           "lagged", "lost", "refused", "address"}
    assert remote["batches"] > 0 and remote["peak"] >= 1 and remote["bytes_per_s"] >= 0
    assert remote["capacity"] == 2  # two workers of one thread
    assert remote["address"] == shared_dask_cluster.address
    assert remote["lost"] is None and remote["retries"] == 0 and remote["refused"] == {}


@pytest.mark.timeout(60)
def test_a_client_given_as_cluster_is_used_and_left_open(shared_dask_cluster):
    n = 96
    want, = reference(n)
    with distributed.Client(shared_dask_cluster.address, timeout=10) as client:
        with remote_loader(Seeded(n, delay_s=0.005), client, remote_min=1) as dl:
            got = list(dl)
            remote = dl.stats()["remote"]
        assert_same_epoch(got, want)
        assert remote["batches"] > 0 and remote["address"] == shared_dask_cluster.address
        # The user's client: the loader does not close it, and holds nothing on it
        # once closed (its job, the pickled dataset, was kept on the workers).
        assert client.submit(lambda: 1).result(timeout=10) == 1
        deadline = time.monotonic() + 10
        while (held := [k for k in client.who_has() if str(k).startswith("_Job")]) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert held == []
    with pytest.raises(stoker.ClusterError, match="the Dask client given as cluster= is closed"):
        remote_loader(Seeded(n), client)


@pytest.mark.timeout(120)
def test_a_cluster_closed_between_tasks_is_said_lost():
    # A LocalCluster closed while no remote task ran (its workers leave, then
    # its scheduler): the client closed, yet nothing said the cluster was
    # gone (lost stayed None, no warning) and the watch polled for good.
    n = 96
    want = reference(n, epochs=2)
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    address = cluster.scheduler_address
    try:
        with remote_loader(Seeded(n, delay_s=0.005), address, remote_min=1,
                           remote_timeout=10) as dl:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                first = list(dl)
                time.sleep(1)  # the look-ahead made: no task runs
                cluster.close(timeout=20)
                deadline = time.monotonic() + 60
                while dl.stats()["remote"]["lost"] is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                remote = dl.stats()["remote"]
                second = list(dl)
    finally:
        cluster.close()
    assert remote["lost"], remote
    assert any(address in str(w.message) for w in caught
               if issubclass(w.category, RuntimeWarning))
    assert_same_epoch(first, want[0])
    assert_same_epoch(second, want[1])


@pytest.mark.parametrize("address,said", [("http://127.0.0.1:8786", "unknown address scheme"),
                                          ("", "names no scheduler"),
                                          ("tcp://127.0.0.1", "missing port number"),
                                          ("tls://127.0.0.1:8786", "needs cluster_security")])
def test_an_address_dask_cannot_use_is_refused_and_the_exit_is_prompt(address, said):
    # A Client was made for it: refused at once, it then held the
    # interpreter's exit for twice remote_timeout (124 s at the default);
    # for an address only the Client refused (no port, tls:// without
    # cluster_security), the Client left half-made did.
    script = textwrap.dedent(f"""
        import stoker
        from remote_datasets import Seeded
        try:
            stoker.DataLoader(Seeded(8), batch_size=4, num_workers="auto", cluster={address!r})
        except stoker.ClusterError as e:
            print("refused:", e)
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=50, cwd=os.path.dirname(__file__))
    assert r.returncode == 0 and "refused:" in r.stdout and said in r.stdout, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr


def test_a_wait_for_the_cluster_ends_once_no_answer_can_come():
    # A client the user closed mid-epoch: the batch in flight waited all of
    # remote_timeout (60 s) for a gather that could never answer.
    from stoker import _remote
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="given up"):
        _remote._within(30, lambda: time.sleep(3), lambda: time.monotonic() - began > 0.2)
    with pytest.raises(TimeoutError, match="within 0.2 s"):
        _remote._within(0.2, lambda: time.sleep(3), lambda: False)
    assert _remote._within(5, lambda: 7, lambda: False) == 7


@pytest.mark.timeout(60)
def test_a_dataset_the_workers_cannot_import_is_a_cluster_error_naming_it(shared_dask_cluster,
                                                                          tmp_path, monkeypatch):
    (tmp_path / "only_here.py").write_text(
        "import torch\n"
        "class OnlyHere(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 8\n"
        "    def __getitem__(self, i): return torch.tensor([i])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here
    with pytest.raises(stoker.ClusterError, match=r"cannot load the loader's job \(dataset "
                       r"only_here\.OnlyHere\): .*No module named 'only_here'.*importable"):
        remote_loader(only_here.OnlyHere(), shared_dask_cluster.address)


@pytest.mark.timeout(60)
def test_a_dataset_that_does_not_load_on_the_workers_is_a_cluster_error_with_its_reason(
        shared_dask_cluster):
    # Before: Dask's "Stream is closed" (the worker's connection, closed as
    # it failed); the FileNotFoundError was in the worker's log alone.
    with pytest.raises(stoker.ClusterError, match=r"cannot load the loader's job \(dataset "
                       r"remote_datasets\.LoadsOnlyHere\): FileNotFoundError: .*" +
                       MISSING_THERE):
        remote_loader(LoadsOnlyHere(8), shared_dask_cluster.address)


@pytest.mark.timeout(120)
def test_a_worker_that_joins_late_and_cannot_load_the_job_is_named_and_left_out(
        dask_cluster_factory):
    # Before: its sends failed every 5 s for good, without a word.
    cluster = dask_cluster_factory(workers=0)
    n, epochs = 80, 100
    want = reference(n, epochs)
    with remote_loader(LoadsOnlyHere(n), cluster.address, remote_min=1) as dl:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            worker = cluster.worker_address(cluster.add_worker())
            for epoch in range(epochs):  # the sends fail 5 s apart: three in 10 s and more
                assert_same_epoch(list(dl), want[epoch])  # made here meanwhile
                if (remote := dl.stats()["remote"])["refused"]:
                    break
                time.sleep(0.5)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(worker in m and "FileNotFoundError" in m and MISSING_THERE in m
               for m in said), said
    assert list(remote["refused"]) == [worker] and MISSING_THERE in remote["refused"][worker]
    assert remote["capacity"] == 0 and remote["lost"] is None and remote["batches"] == 0


@pytest.mark.timeout(60)
def test_a_worker_killed_mid_task_has_its_batch_rerun_and_a_new_one_is_used(
        dask_cluster_factory, tmp_path):
    # The worker logs the samples it starts; worker-0 is killed (SIGKILL)
    # while one of its batches (8 samples of 20 ms) is under way, and
    # worker-1 is started while the epoch goes on.
    started = tmp_path / "started"
    started.mkdir()
    cluster = dask_cluster_factory(workers=1, env={STARTED_DIR_ENV: str(started)})
    n = 160
    want = reference(n, epochs=2)

    def kill_and_replace():
        cluster.kill_worker("worker-0")
        cluster.add_worker("worker-1")

    with remote_loader(Seeded(n, delay_s=0.02), cluster.address, remote_min=1) as dl:
        watcher = WhenRemoteStarts(str(started), "worker-0", kill_and_replace)
        first = list(dl)
        watcher.join()
        after_kill = dl.stats()["remote"]
        second = list(dl)  # the cluster is used on, with the workers it has now
        remote = dl.stats()["remote"]
    assert_same_epoch(first, want[0])
    assert_same_epoch(second, want[1])
    assert after_kill["retries"] == 1  # the killed worker's batch, re-run (once: one slot)
    assert remote["lost"] is None and remote["capacity"] == 1
    assert remote["batches"] > after_kill["batches"]  # made by worker-1


@pytest.mark.timeout(60)
def test_a_cluster_with_no_worker_yet_is_used_once_one_joins(dask_cluster_factory):
    # A job script starting the scheduler, its workers and the training at
    # once: the loader is made at once, its first epoch local, and the job
    # goes to the worker that joins.
    cluster = dask_cluster_factory(workers=0)
    n = 80
    # Before, making it waited remote_timeout for a worker, then raised Dask's TimeoutError.
    with remote_loader(Seeded(n, delay_s=0.01), cluster.address, remote_min=1,
                       remote_timeout=20) as dl:
        first = list(dl)
        before = dl.stats()["remote"]
        cluster.add_worker()
        # It gets tasks once a check ran there (its first epoch may be over by then).
        later = []
        for _ in range(50):
            later.append(list(dl))
            remote = dl.stats()["remote"]
            if remote["batches"] > 0:
                break
    want = reference(n, epochs=1 + len(later))
    for got, w in zip([first] + later, want):
        assert_same_epoch(got, w)
    assert before["batches"] == 0 and before["lost"] is None
    assert remote["batches"] > 0 and remote["lost"] is None and remote["retries"] == 0


@pytest.mark.timeout(120)
def test_the_job_sent_to_a_worker_that_joined_late_holds_up_no_batch(dask_cluster_factory,
                                                                     tmp_path):
    # A big dataset takes seconds to reach a worker that joins late; here its
    # send lasts until the test opens a gate. Before, the slot that claimed
    # the next batch sent it, and the consumer waited for that batch up to
    # 10 s a claim (the epoch outlasted the gate's WAIT_S); now it is sent in
    # the background and no slot is offered until it is there.
    gate = tmp_path / "gate"
    cluster = dask_cluster_factory(workers=0)
    n = 240
    want = reference(n, epochs=1)[0]
    with remote_loader(LoadsAtGate(n, delay_s=0.005), cluster.address, remote_min=1) as dl:
        cluster.add_worker(env={GATE_ENV: str(gate)})
        deadline = time.monotonic() + WAIT_S
        while not dl._run.cluster._usable_workers(set())[0]:  # its check ran: usable
            assert time.monotonic() < deadline, "the worker that joined was never checked"
            time.sleep(0.05)
        opener = threading.Timer(WAIT_S, gate.touch)  # only a consumer held this long waits
        opener.start()
        try:
            got = list(dl)
            held = not gate.exists()
        finally:
            opener.cancel()
            gate.touch()
        # The job lands once the gate opens, and the worker makes batches.
        for _ in range(50):
            list(dl)
            remote = dl.stats()["remote"]
            if remote["batches"] > 0:
                break
    assert_same_epoch(got, want)
    assert held, "the consumer waited for the job's send"
    assert remote["batches"] > 0 and remote["lost"] is None and remote["retries"] == 0


@pytest.mark.timeout(60)
def test_a_scheduler_that_goes_away_leaves_the_rest_to_local_workers(dask_cluster_factory):
    # SIGKILL: gone without a word, as a machine that dies.
    cluster = dask_cluster_factory(workers=1)
    n = 80
    want = reference(n, epochs=2)
    address = cluster.address
    with remote_loader(Seeded(n, delay_s=0.02), address, remote_min=1) as dl:
        got, made_before = [], None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for batch in dl:
                got.append(batch)
                made = dl.stats()["remote"]["batches"]
                if made_before is None and made >= 1:
                    made_before = made
                    cluster.stop_scheduler(signal.SIGKILL)
            # The next epoch: local. The loss is said once, in whichever epoch
            # noticed it (on a loaded machine local workers may end the first
            # before the client gives the scheduler up).
            again = list(dl)
        remote = dl.stats()["remote"]
    assert made_before is not None, "no remote batch came before the epoch ended"
    named = [w for w in caught
             if issubclass(w.category, RuntimeWarning) and address in str(w.message)]
    assert named, [str(w.message) for w in caught]
    assert_same_epoch(got, want[0])
    assert_same_epoch(again, want[1])
    assert isinstance(remote["lost"], str) and remote["lost"]
    assert remote["batches"] >= made_before  # the batches made remotely stay made
    assert remote["workers"] == 0 and remote["address"] == address


@pytest.mark.timeout(60)
@pytest.mark.parametrize("taken_with_cluster", [True, False],
                         ids=["cluster-then-local", "local-then-cluster"])
def test_a_checkpoint_resumes_with_or_without_a_cluster_with_exactly_the_rest(
        shared_dask_cluster, taken_with_cluster):
    n, taken = 160, 6
    want, = reference(n)

    def loader(with_cluster):
        ds = Seeded(n, delay_s=0.005)
        if with_cluster:
            return remote_loader(ds, shared_dask_cluster.address, remote_min=1)
        return make_loader(ds, num_workers="auto", max_workers=1)

    with loader(taken_with_cluster) as dl:
        it = iter(dl)
        head = [next(it) for _ in range(taken)]
        state = dl.state_dict()
    # The same position, no cluster (with workers: torch's iterator, and so the
    # checkpoint's iter_calls, differ without).
    with make_loader(Seeded(n), num_workers=1) as dl:
        it = iter(dl)
        for _ in range(taken):
            next(it)
        assert state == dl.state_dict()  # one shape and one content, with or without
    with loader(not taken_with_cluster) as dl:
        dl.load_state_dict(state)
        rest = list(dl)
    assert_same_epoch(head + rest, want)


@pytest.mark.timeout(60)
def test_remote_workers_over_tls(dask_tls_cluster):
    n = 96
    want, = reference(n)
    with remote_loader(Seeded(n, delay_s=0.005), dask_tls_cluster.address, remote_min=1,
                       cluster_security=dask_tls_cluster.security()) as dl:
        got = list(dl)
        remote = dl.stats()["remote"]
    assert_same_epoch(got, want)
    assert remote["batches"] > 0 and remote["address"] == dask_tls_cluster.address


@pytest.mark.timeout(60)
def test_a_worker_of_another_stoker_version_is_refused(shared_dask_cluster):
    # STOKER_VERSION_OVERRIDE: a testing hook read where stoker reports its
    # own version (for this test only), so that worker "odd" claims another.
    cluster = shared_dask_cluster
    cluster.add_worker("odd", env={"STOKER_VERSION_OVERRIDE": "0.0.0-test"})
    try:
        with pytest.raises(stoker.ClusterError) as refused:
            remote_loader(Seeded(16), cluster.address).close()
        message = str(refused.value)
        assert cluster.worker_address("odd") in message
        assert "stoker" in message and "0.0.0-test" in message
        for good in ("worker-0", "worker-1"):  # the others are not blamed
            assert cluster.worker_address(good) not in message
        assert isinstance(refused.value, RuntimeError)
    finally:
        cluster.kill_worker("odd")  # the shared cluster as it was


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_order", [True, False])
def test_a_remote_task_that_hangs_is_rerun_after_remote_timeout(shared_dask_cluster, in_order):
    # On "stuck" every sample sleeps forever (HANG_ENV); the others answer.
    # Three slots in use: one is stuck's. In order, the consumer waits for
    # its batch, which lags and is made locally before remote_timeout; out
    # of order, nothing waits for it: remote_timeout ends it.
    cluster = shared_dask_cluster
    stuck = cluster.add_worker(f"stuck-{in_order}", env={HANG_ENV: "1"})
    try:
        # Enough batches that Dask gives "stuck" one: with few, an epoch may end on the others.
        n = 384
        want, = reference(n)
        with remote_loader(Seeded(n, delay_s=0.005, hang_where_marked=True), cluster.address,
                           remote_min=3, remote_timeout=2.0, in_order=in_order) as dl:
            got = list(dl)
            remote = dl.stats()["remote"]
        if not in_order:
            got.sort(key=lambda b: b["index"][0].item())
            want.sort(key=lambda b: b["index"][0].item())
        assert_same_epoch(got, want)
        # The stuck worker is suspected: it offers no slot for a while.
        assert remote["retries" if not in_order else "lagged"] >= 1 and remote["capacity"] == 2
    finally:
        cluster.kill_worker(stuck)  # the only way to end its sleep, and the cluster as it was


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["DataLoader", "Loader"])
def test_a_scheduler_that_stops_answering_is_given_up_after_remote_timeout(
        dask_cluster_factory, image_tree, kind):
    # SIGSTOP: its connections stay open, nothing answers (a hung machine).
    # The epoch completes locally, within remote_timeout and the local time
    # (before: batches were sent to it again and again, for minutes).
    cluster = dask_cluster_factory(workers=2)
    address, timeout_s = cluster.address, 3.0
    scheduler = cluster.pid("scheduler")
    if kind == "DataLoader":
        n = 240
        want = reference(n, epochs=2)
        loader = remote_loader(Seeded(n, delay_s=0.01), address, remote_min=2,
                               remote_timeout=timeout_s)
    else:
        loader = stoker.Loader(image_tree, batch_size=4, seed=SEED, output="numpy",
                               transforms=stoker.transforms.train(32, layout="uint8_chw"),
                               workers="auto", max_workers=1, remote_min=2, cluster=address,
                               tune_interval=0.05, remote_timeout=timeout_s)
    stopped, after = None, 2 if kind == "DataLoader" else 5  # epochs read after the stop
    try:
        with loader, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            epochs = []
            while stopped is None or len(epochs) < after:
                assert len(epochs) < 50, f"no remote batch: {loader.stats()['remote']}"
                got = []
                for batch in loader:
                    got.append(batch if kind == "DataLoader" else batch[1].copy())
                    if stopped is None and loader.stats()["remote"]["batches"] >= 3:
                        os.kill(scheduler, signal.SIGSTOP)
                        stopped = time.monotonic()
                if stopped is not None:
                    epochs.append(got)
            took = time.monotonic() - stopped
            remote = loader.stats()["remote"]
        assert took < timeout_s + 20, f"{took:.1f} s after the scheduler stopped"
    finally:
        os.kill(scheduler, signal.SIGCONT)
    if kind == "DataLoader":
        assert_same_epoch(epochs[0], want[0])
        assert_same_epoch(epochs[1], want[1])
    assert isinstance(remote["lost"], str) and "answer" in remote["lost"]
    assert remote["capacity"] == 0
    named = [w for w in caught
             if issubclass(w.category, RuntimeWarning) and address in str(w.message)]
    assert named, [str(w.message) for w in caught]


@pytest.mark.timeout(120)
def test_a_cluster_whose_workers_all_die_hands_its_batches_to_local_workers_at_once(
        dask_cluster_factory):
    # Every worker SIGKILLed mid-epoch, the scheduler up: the slots go at
    # once (before: 10 s per slot, one after another, sending the job again).
    cluster = dask_cluster_factory(workers=3)
    n = 240
    want = reference(n, epochs=3)
    with remote_loader(Seeded(n, delay_s=0.01), cluster.address, remote_min=3) as dl:
        got, killed, longest, last = [], None, 0.0, None
        for batch in dl:
            got.append(batch)
            now = time.monotonic()
            if killed is not None:
                longest, last = max(longest, now - last), now
            elif dl.stats()["remote"]["batches"] >= 3:
                for name in cluster.worker_names:
                    cluster.kill_worker(name)
                killed = last = time.monotonic()
        rest = time.monotonic() - killed
        again = list(dl)
        remote = dl.stats()["remote"]
        cluster.add_worker()  # a worker that joins is used: the job is sent to it
        third = list(dl)
        rejoined = dl.stats()["remote"]
    assert killed is not None, "no remote batch before the epoch ended"
    assert longest < 5 and rest < 15, (longest, rest)
    assert_same_epoch(got, want[0])
    assert_same_epoch(again, want[1])
    assert remote["lost"] is None and remote["capacity"] == 0 and remote["workers"] == 0
    # A batch made again counts once; tries that found no worker to send it to do not.
    # (None at all when the batches in flight were taken over as lagging first.)
    assert remote["retries"] <= 3
    assert_same_epoch(third, want[2])
    assert rejoined["capacity"] == 1 and rejoined["batches"] > remote["batches"]


def run_script(code, address):
    """Runs `code` as a script of its own (its __main__) with the cluster's
    address as its argument, importing this stoker and the tests' modules."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(stoker.__file__))), tests,
         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                          timeout=100, env=env)


EXIT_OPEN = """
import sys
import stoker
from remote_datasets import Seeded
dl = stoker.DataLoader(Seeded(100000, delay_s=0.01), batch_size=4, num_workers="auto",
                       cluster=sys.argv[1], max_workers=1, remote_min=2)
it = iter(dl)
while dl.stats()["remote"]["batches"] < 5:
    next(it)
# The script ends here, its loader open and its remote slots' tasks in flight.
"""


@pytest.mark.timeout(120)
def test_a_script_that_ends_with_a_remote_loader_open_exits_quietly(shared_dask_cluster):
    # Before, each task that ended while the exit closed the loader logged
    # tornado's "ERROR - Exception in callback ... done_callback ...
    # RuntimeError: cannot schedule new futures after shutdown": its done
    # callback went to Dask's executor, which the exit had shut down first.
    out = run_script(EXIT_OPEN, shared_dask_cluster.address)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "ERROR" not in out.stderr, out.stderr


SCRIPT_CLASSES = """
import dataclasses
import sys
import textwrap
import time
import stoker
import torch
from distributed import get_worker


@dataclasses.dataclass
class Sample:
    index: int


class Refused(Exception):
    pass


def remote():
    try:
        get_worker()
        return True
    except ValueError:
        return False


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        time.sleep(0.01)  # a read: the remote slot starts while the epoch runs
        if i % 40 == 39 and remote():
            raise Refused(f"sample {i}")
        return Sample(i)


dl = stoker.DataLoader(Samples(), batch_size=4, num_workers="auto", cluster=sys.argv[1],
                       max_workers=1, remote_min=1, collate_fn=list)
got, raised = [], []
it = iter(dl)
while True:
    try:
        batch = next(it)
    except StopIteration:
        break
    except Refused as e:  # of this script's own type, wherever it was raised
        raised.append(e.index)
        continue
    assert all(type(s) is Sample for s in batch), batch  # this script's own class
    got.extend(s.index for s in batch)
remote = dl.stats()["remote"]["batches"]
dl.close()
print(remote, len(raised), sorted(got + raised) == list(range(400)))
"""


@pytest.mark.timeout(120)
def test_classes_of_the_users_script_come_back_as_its_own_from_a_remote_batch(
        shared_dask_cluster):
    # A Dask worker holds a class of the script (__main__) only as cloudpickle
    # rebuilt it: a batch of its instances, or its exception, pickled there
    # by plain pickle failed the batch ("it's not the same object as
    # __main__.Sample") or lost the exception's type.
    out = run_script(SCRIPT_CLASSES, shared_dask_cluster.address)
    assert out.returncode == 0, out.stderr
    remote, raised, whole = out.stdout.split()
    assert int(remote) > 0 and int(raised) > 0, out.stdout  # remote batches, remote failures
    assert whole == "True", out.stdout  # each sample delivered or raised, once


def job_holders(dl):
    """The Dask workers that hold a DataLoader's job now."""
    cluster = dl._run.cluster
    return cluster.client.who_has(cluster._job)[cluster._job.key]


@pytest.mark.timeout(120)
def test_a_frozen_worker_is_left_out_and_the_healthy_one_kept(dask_cluster_factory):
    # The worker that holds the job (Dask keeps one copy of it once the
    # tasks that wanted it are done) is stopped (SIGSTOP): a task for the
    # other one waits to fetch the job from it. Only the stopped worker is
    # suspected, and the job is sent to the other (before: both were, and
    # no slot was offered for a minute).
    cluster = dask_cluster_factory(workers=2)
    n = 240
    want = reference(n, epochs=2)
    with remote_loader(Seeded(n, delay_s=0.01), cluster.address, remote_min=2,
                       remote_timeout=3.0) as dl:
        deadline = time.monotonic() + WAIT_S
        while len(job_holders(dl)) != 1:
            assert time.monotonic() < deadline, job_holders(dl)
            time.sleep(0.1)
        frozen, = job_holders(dl)
        name, = [w for w in cluster.worker_names if cluster.worker_address(w) == frozen]
        healthy, = [cluster.worker_address(w) for w in cluster.worker_names if w != name]
        pid, stopped = cluster.pid(name), False
        try:
            got = []
            for batch in dl:
                got.append(batch)
                if not stopped and dl.stats()["remote"]["batches"] >= 3:
                    os.kill(pid, signal.SIGSTOP)
                    stopped = True
            made = dl.stats()["remote"]["batches"]
            second = list(dl)
            time.sleep(1.0)  # the watch re-reads the workers every 0.5 s
            remote = dl.stats()["remote"]
            suspects = set(dl._run.cluster._suspects)
        finally:
            os.kill(pid, signal.SIGCONT)
    assert stopped, "no remote batch before the epoch ended"
    assert_same_epoch(got, want[0])
    assert_same_epoch(second, want[1])
    assert suspects == {frozen} and healthy not in suspects
    assert remote["capacity"] == 1 and remote["lost"] is None
    assert remote["batches"] > made  # the healthy worker went on making batches


def started_on(folder, worker):
    """The samples a worker started, as its log in `folder` says."""
    path = os.path.join(folder, worker)
    return [] if not os.path.exists(path) else open(path).read().split()


@pytest.mark.timeout(120)
def test_a_slow_worker_lags_its_batches_are_made_locally_and_it_is_left_out(
        dask_cluster_factory, tmp_path):
    # The one remote worker takes 0.25 s more a sample (2 s a batch, against
    # 40 ms on the local worker). A batch of it that the consumer waits for
    # is made locally (before: each epoch waited for its batches); after a
    # second one lagged it gets no task.
    started = tmp_path / "started"
    started.mkdir()
    cluster = dask_cluster_factory(
        workers={"slow": {SLOW_ENV: "0.25", STARTED_DIR_ENV: str(started)}})
    n = 240
    want = reference(n, epochs=2)
    with remote_loader(Seeded(n, delay_s=0.005), cluster.address, remote_min=1) as dl:
        got = [list(dl) for _ in range(2)]
        time.sleep(1.0)  # the watch re-reads the workers every 0.5 s
        remote = dl.stats()["remote"]
        suspects = set(dl._run.cluster._suspects)
        metrics = dl._run.engine.metrics()
    for epoch, w in zip(got, want):
        assert_same_epoch(epoch, w)
    assert remote["lagged"] >= 2 and remote["lost"] is None
    # The slot's thread made the lagged batches: the tuner's model of the
    # local workers leaves them out (it read them as a worker waiting).
    assert metrics["remote_samples_produced"] >= remote["batches"] + remote["lagged"]
    assert suspects == {cluster.worker_address("slow")} and remote["capacity"] == 0
    # Two tasks (their first samples), perhaps one more sent as the second lagged.
    assert len(started_on(started, "slow")) <= 3 * BATCH, started_on(started, "slow")


class Locked(Seeded):
    """A dataset that holds a lock: it does not pickle."""

    def __init__(self, n):
        super().__init__(n)
        self.lock = threading.Lock()


@pytest.mark.timeout(60)
def test_a_dataset_that_does_not_pickle_is_named_with_the_reason(shared_dask_cluster):
    # Before: TypeError('Could not serialize object of type _Job'), stoker's internals only.
    with pytest.raises(stoker.ClusterError) as refused:
        remote_loader(Locked(16), shared_dask_cluster.address).close()
    message = str(refused.value)
    assert "dataset" in message and "Locked" in message, message
    assert "cannot pickle '_thread.lock' object" in message, message
    assert isinstance(refused.value.__cause__, TypeError)


@pytest.mark.timeout(60)
def test_a_collate_fn_that_does_not_pickle_is_named_by_its_own_name(shared_dask_cluster):
    # Before: "collate_fn (builtins.function)", and advice for a dataset.
    lock = threading.Lock()

    def collate_holding_a_lock(batch):
        with lock:
            return torch.utils.data.default_collate(batch)

    with pytest.raises(stoker.ClusterError) as refused:
        remote_loader(Seeded(16), shared_dask_cluster.address,
                      collate_fn=collate_holding_a_lock).close()
    message = str(refused.value)
    assert "collate_fn (test_remote.test_a_collate_fn_that_does_not_pickle_is_named_by_its_own_" \
        "name.<locals>.collate_holding_a_lock)" in message, message
    assert "__getitem__" not in message and "top level" in message, message


@pytest.mark.timeout(120)
def test_a_worker_of_another_stoker_version_that_joins_late_is_named_and_left_out(
        dask_cluster_factory):
    # Before: the whole cluster was dropped, and no worker named.
    cluster = dask_cluster_factory(workers=1)
    n = 400
    want = reference(n, epochs=3)
    good = cluster.worker_address("worker-0")
    with remote_loader(Seeded(n, delay_s=0.01), cluster.address, remote_min=2) as dl:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            epochs, odd = [], None
            for epoch in range(3):
                got, it = [], iter(dl)
                for batch in it:
                    got.append(batch)
                    if odd is None and len(got) == 5:
                        odd = cluster.worker_address(cluster.add_worker(
                            "odd", env={"STOKER_VERSION_OVERRIDE": "0.0.0-test"}))
                epochs.append(got)
                if any("0.0.0-test" in str(w.message) for w in caught):
                    break  # the odd worker was given a task
            made = dl.stats()["remote"]["batches"]
            epochs.append(list(dl))  # the good worker goes on
            remote = dl.stats()["remote"]
    for got, w in zip(epochs, want + reference(n, epochs=len(epochs))[len(want):]):
        assert_same_epoch(got, w)
    named = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(odd in m and "0.0.0-test" in m for m in named), named
    assert not any(good in m for m in named), named
    assert remote["lost"] is None and remote["capacity"] == 1
    assert remote["batches"] > made


@pytest.mark.timeout(120)
def test_a_sharded_stream_on_remote_slots_and_resized_local_workers(shared_dask_cluster):
    # Shards go to remote slots and local worker processes alike, the pool
    # resized as it goes. Every sample once, the same batches as without a
    # cluster, and no segment kept once the batches are dropped.
    import random
    rng = random.Random(3)
    ds = SeededShards([rng.randrange(0, 30) for _ in range(24)], delay_s=0.002)
    every = sorted(i * 1000 + k for i, n in enumerate(ds.lens) for k in range(n))

    def keys(loader):
        return [(a.flatten().tolist(), b.flatten().tolist()) for a, b in loader]

    with make_loader(ds, num_workers=2) as dl:
        want = [keys(dl) for _ in range(3)]
    with make_loader(ds, num_workers="auto", max_workers=2, cluster=shared_dask_cluster.address,
                     remote_min=2) as dl:
        # Epochs until the cluster made some (an epoch is short: a worker an
        # earlier test killed may still be listed by the scheduler a moment).
        for epoch in range(3):
            got, it = [], iter(dl)
            for a, b in it:
                got.append((a.flatten().tolist(), b.flatten().tolist()))
                if rng.random() < 0.3:
                    dl._run.engine.resize(rng.randint(3, 4))  # 2 of them remote
            assert sorted(i for ids, _ in got for i in ids) == every
            assert got == want[epoch]
            if dl.stats()["remote"]["batches"] > 0:
                break
        assert dl.stats()["remote"]["batches"] > 0
        del a, b, it
        gc.collect()
        assert dl._run.workers.segment_bytes()[1] == 0


@pytest.mark.timeout(60)
def test_a_consumer_bound_loop_borrows_no_remote_slot(shared_dask_cluster):
    n, step_s = 48, 0.4  # six batches, each far quicker to make than the step
    with make_loader(Seeded(n), num_workers="auto", cluster=shared_dask_cluster.address) as dl:
        for _ in dl:
            time.sleep(step_s)
        remote = dl.stats()["remote"]
    assert remote["peak"] == 0 and remote["batches"] == 0
    assert remote["capacity"] == 2 and remote["lost"] is None  # it was there to borrow


@pytest.mark.timeout(60)
def test_a_starved_consumer_with_its_local_workers_capped_borrows_and_says_why(
        shared_dask_cluster):
    # One local worker (max_workers=1) at 20 ms a sample, a consumer that
    # takes batches as fast as they come: the tuner borrows, without remote_min.
    n = 320
    want, = reference(n)
    with remote_loader(Seeded(n, delay_s=0.02), shared_dask_cluster.address) as dl:
        got = list(dl)
        remote = dl.stats()["remote"]
        trace = dl.tuner_trace()
    assert_same_epoch(got, want)
    assert remote["peak"] >= 1 and remote["batches"] > 0
    borrowed = [d for d in trace if d["remote_after"] > d["remote_before"]]
    assert borrowed, trace
    assert "local CPU budget is spent" in borrowed[0]["reason"]
    assert borrowed[0]["remote_after"] <= remote["capacity"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_cluster_needs_num_workers_auto(shared_dask_cluster, workers):
    with pytest.raises(ValueError, match="cluster"):
        make_loader(Seeded(16), num_workers=workers, cluster=shared_dask_cluster.address)
