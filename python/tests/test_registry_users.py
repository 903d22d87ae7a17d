"""The node registry against a second user (docs/tuner.md, "Loaders sharing a
node"): a user made by the test plants folders and links where root's loaders
would put their registry, and runs loaders of its own. Everything happens in
a private mount namespace with fresh /dev/shm and /tmp, so the machine's own
paths are never touched."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

import stoker

# Prints the node registry a tuned loader uses, as stats() tells it, after a
# few batches; with "hold", keeps iterating for `seconds` first.
PROBE = textwrap.dedent("""
    import json, sys, time, stoker
    source = stoker.Synthetic(size=64, shape=(16,), cpu_cost_us=200)
    loader = stoker.Loader(source, batch_size=8, workers="auto", tune_interval=0.01)
    end = time.monotonic() + float(sys.argv[1])
    node = None
    while node is None or time.monotonic() < end:
        for _ in loader:
            pass
        node = loader.stats()["tuner"]["node"]
    print(json.dumps({"registry": node["registry"], "note": node["note"],
                      "loaders": node.get("loaders")}))
""")


def _second_user_setup():
    """The reason the test cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create a second user"
    for tool in ("useradd", "userdel", "runuser", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs",
                            "tmpfs", "/mnt"], capture_output=True)
    if probe.returncode != 0:
        return f"cannot make a private mount namespace here: {probe.stderr.decode().strip()}"
    return None


@pytest.fixture
def second_user():
    """A fresh user (name, uid) that can read the build, removed after."""
    reason = _second_user_setup()
    if reason is not None:
        pytest.skip(reason)
    name = "stk" + uuid.uuid4().hex[:8]
    made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd refused: {made.stderr.strip()}")
    try:
        uid = int(subprocess.check_output(["id", "-u", name], text=True))
        yield name, uid
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def _in_namespace(script, user):
    """Runs bash `script` in a private mount namespace with empty /dev/shm and
    /tmp; $U is the second user, $PROBE runs the probe (`$PROBE seconds`)."""
    pythonpath = os.path.dirname(os.path.dirname(os.path.abspath(stoker.__file__)))
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "U": user, "PYTHONPATH": pythonpath,
           "PY": sys.executable, "PROBE_SRC": PROBE, "HOME": "/"}
    body = textwrap.dedent("""
        set -e
        exec 9<"$PYTHONPATH"  # the package, brought back should a checkout under /tmp hide it
        mount -t tmpfs -o mode=1777 tmpfs /dev/shm
        mount -t tmpfs -o mode=1777 tmpfs /tmp
        if [ ! -d "$PYTHONPATH" ]; then
            mkdir -p "$PYTHONPATH"
            mount --no-canonicalize --bind /proc/self/fd/9 "$PYTHONPATH"
        fi
        exec 9<&-
        cd /
        PROBE() { "$PY" -c "$PROBE_SRC" "$@"; }
        AS_U() { runuser -u "$U" -- env -i PATH="$PATH" PYTHONPATH="$PYTHONPATH" HOME=/ "$@"; }
    """) + textwrap.dedent(script)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", body],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_paths_a_second_user_planted_are_refused_and_users_do_not_share(second_user):
    name, uid = second_user
    # 1. The second user owns a world-writable folder where root's registry
    # folder goes, and a link to a file of root's where the fallback goes:
    # root's loader uses neither (no registry, named in the note) and writes
    # nothing through them.
    planted, = _in_namespace("""
        AS_U mkdir -m 0777 /dev/shm/stoker-0
        echo "root's file" > /tmp/target && chmod 0644 /tmp/target
        AS_U ln -s /tmp/target /tmp/stoker-0
        unset XDG_RUNTIME_DIR STOKER_NODE_REGISTRY
        PROBE 0
        test "$(cat /tmp/target)" = "root's file"
        test -z "$(ls -A /dev/shm/stoker-0)"
    """, name)
    assert planted["registry"] is None, planted
    assert "/dev/shm/stoker-0" in planted["note"] and "/tmp/stoker-0" in planted["note"], planted

    # 2. Each user's loaders share a registry of their own: root's loader and
    # the second user's, running at once, each see one loader, and the second
    # user cannot write root's registry.
    root, theirs = _in_namespace("""
        unset XDG_RUNTIME_DIR STOKER_NODE_REGISTRY
        AS_U "$PY" -c "$PROBE_SRC" 6 > /tmp/theirs.json &
        sleep 2
        PROBE 2
        wait
        cat /tmp/theirs.json
        test -f /dev/shm/stoker-0/node-v3
        ! AS_U sh -c 'echo x >> /dev/shm/stoker-0/node-v3' 2>/dev/null
    """, name)
    assert root["registry"] == "/dev/shm/stoker-0/node-v3" and root["loaders"] == 1, root
    assert theirs["registry"] == f"/dev/shm/stoker-{uid}/node-v3", theirs
    assert theirs["loaders"] == 1, theirs
