"""A starting worker takes back at once the leases of a holder it knows is
gone (`jobs.holders`, `Store.take_over`): a dead process of its own host
(boot id, pid namespace, pid and start time in the worker id), or a previous
process under its own stable `--worker-id`. Every other lease waits for its
expiry. Real processes for kill -9; the leases are long (300 s), so only the
takeover can explain a job running again."""

import os
import signal
import socket
import subprocess
import time

import pytest

from jobs import holders
from jobs.errors import Conflict
from jobs.models import Job
from jobs.worker import Worker, WorkerConfig
from tests.support import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(holders.this_place() is None, reason="needs /proc (boot id, pid namespace)"),
]

LONG = 300.0


def job(key, tenant="studio"):
    return Job.objects.get(tenant=tenant, key=key)


def local_id(pid: int, start: int, place: str | None = None) -> str:
    return f"{socket.gethostname()}:{pid}:{start}:{place or holders.this_place()}"


def dead_process() -> tuple[int, int]:
    """The pid and start time of a process of this host that has ended."""
    proc = subprocess.Popen(["sleep", "60"])
    start = holders.process_start(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, start


def leased(store, key: str, holder: str) -> Job:
    store.enqueue("studio", key)
    assert store.claim("studio", key, holder, ttl=LONG) == 1
    return job(key)


def start_worker(**config) -> Worker:
    worker = Worker(WorkerConfig(worker_id="heir", until_idle=True, poll_interval=0.05, **config))
    worker.run()
    return worker


def recover_row(key):
    return job(key).events.get(kind="recover")


# ---------------------------------------------------------------- the holder's identity


def test_the_default_worker_id_names_this_boot_namespace_pid_and_start():
    own = holders.worker_id()
    assert own == local_id(os.getpid(), holders.process_start(os.getpid()))
    assert holders.gone(own, place=holders.this_place()) is None


def test_an_ended_process_a_zombie_and_a_reused_pid_are_gone_a_live_one_is_not():
    place = holders.this_place()
    pid, start = dead_process()
    assert "no longer running" in holders.gone(local_id(pid, start), place=place)
    # Killed but not yet reaped by its parent: it has exited all the same.
    zombie = subprocess.Popen(["sleep", "60"])
    zombie_start = holders.process_start(zombie.pid)
    os.kill(zombie.pid, signal.SIGKILL)
    try:
        wait_for(lambda: holders.gone(local_id(zombie.pid, zombie_start), place=place), what="the zombie")
        assert "has exited" in holders.gone(local_id(zombie.pid, zombie_start), place=place)
    finally:
        zombie.wait()
    # This pid, but a start time it never had: the pid was reused.
    own_start = holders.process_start(os.getpid())
    assert "started later" in holders.gone(local_id(os.getpid(), own_start - 1), place=place)
    assert holders.gone(local_id(os.getpid(), own_start), place=place) is None


def test_another_boot_or_namespace_or_an_explicit_id_is_never_judged():
    place = holders.this_place()
    pid, start = dead_process()
    boot, namespace = place.split(":")
    other_boot = "00000000-0000-4000-8000-000000000000"
    assert holders.gone(local_id(pid, start, f"{other_boot}:{namespace}"), place=place) is None
    assert holders.gone(local_id(pid, start, f"{boot}:{int(namespace) + 1}"), place=place) is None
    assert holders.gone("victim", place=place) is None
    assert holders.gone(f"clone-of-{local_id(pid, start)}", place=place) is None
    assert holders.gone(local_id(pid, start), place=None) is None


# ---------------------------------------------------------------- a starting worker


def test_a_starting_worker_takes_back_at_once_the_leases_of_a_dead_process_of_its_host(store):
    pid, start = dead_process()
    dead = local_id(pid, start)
    leased(store, "orphan", dead)
    worker = start_worker()
    assert worker.stats["recovered"] == 1
    j = job("orphan")
    assert (j.state, j.lease_epoch, j.worker_id, j.recoveries) == ("DONE", 2, "heir", 1)
    row = recover_row("orphan")
    assert (row.from_state, row.to_state, row.epoch, row.worker_id, row.actor) == ("LEASED", "READY", 1, dead, "heir")
    assert f"worker {dead} is gone: process {pid} of this host is no longer running" in row.reason
    # The dead holder's late writes are refused by the fence.
    for late_write in (
        lambda: store.finish("studio", "orphan", dead, 1),
        lambda: store.fail("studio", "orphan", dead, 1, error="late"),
        lambda: store.renew("studio", "orphan", dead, 1),
    ):
        with pytest.raises(Conflict):
            late_write()


def test_a_starting_worker_leaves_live_and_foreign_holders_leases_alone(store):
    place = holders.this_place()
    pid, start = dead_process()
    boot, namespace = place.split(":")
    untouched = {
        "alive": holders.worker_id(),  # this very process, alive
        "other-host": local_id(pid, start, f"00000000-0000-4000-8000-000000000000:{namespace}"),
        "other-container": local_id(pid, start, f"{boot}:{int(namespace) + 1}"),
        "explicit": "somebody-else",
    }
    for key, holder in untouched.items():
        leased(store, key, holder)
    start_worker(stable_id=True)
    for key, holder in untouched.items():
        j = job(key)
        assert (j.state, j.lease_epoch, j.worker_id) == ("LEASED", 1, holder), key
        assert not j.events.filter(kind="recover").exists()


def test_a_worker_under_a_stable_id_takes_back_its_previous_process_leases_only_with_the_promise(store):
    leased(store, "mine", "heir")
    start_worker(stable_id=False)
    assert (job("mine").state, job("mine").worker_id) == ("LEASED", "heir")
    start_worker(stable_id=True)
    j = job("mine")
    assert (j.state, j.lease_epoch, j.worker_id) == ("DONE", 2, "heir")
    assert "same stable worker id" in recover_row("mine").reason
    # The previous process under the same id, epoch 1, is fenced out.
    with pytest.raises(Conflict):
        store.finish("studio", "mine", "heir", 1)


# ---------------------------------------------------------------- kill -9, then a new worker


def _killed_then_restarted(store, manage, key, *, worker_id=()):
    """Kill -9 a worker mid-handler (lease 300 s), start another as given:
    returns the seconds from the kill until the job ran again, and the dead
    worker's id."""
    store.enqueue("studio", key, action="test.sleep", payload={"seconds": 60, "first_attempt_only": True})
    victim = manage.start("run_worker", *worker_id, "--lease-ttl", str(LONG), "--poll-interval", "0.1")
    try:
        wait_for(lambda: job(key).state == "LEASED", timeout=60)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        victim.wait(timeout=10)
    finally:
        if victim.poll() is None:
            victim.kill()
    dead = job(key)
    heir = manage.start("run_worker", *worker_id, "--lease-ttl", str(LONG), "--poll-interval", "0.1")
    try:
        wait_for(lambda: job(key).lease_epoch == 2, timeout=60, what="the job to run again")
        again = time.monotonic() - killed
        wait_for(lambda: job(key).state == "DONE", timeout=60)
    finally:
        heir.kill()
        heir.wait()
    row = recover_row(key)
    # Taken back while the dead worker's lease still had most of its time.
    assert row.created_at < dead.lease_until
    assert (row.epoch, row.worker_id) == (1, dead.worker_id)
    print(f"kill -> running again: {again:.2f} s")
    return row, dead.worker_id


def test_kill_9_mid_handler_then_a_new_worker_of_the_host_runs_the_job_again_before_the_lease_ends(store, manage):
    row, dead = _killed_then_restarted(store, manage, "killed")
    assert holders.this_place() in dead
    assert "of this host is no longer running" in row.reason
    j = job("killed")
    assert j.worker_id != dead
    with pytest.raises(Conflict):
        store.finish("studio", "killed", dead, 1)


def test_kill_9_mid_handler_then_a_restart_under_the_same_worker_id_runs_the_job_again(store, manage):
    row, dead = _killed_then_restarted(store, manage, "restarted", worker_id=("--worker-id", "pod-0"))
    assert dead == "pod-0"
    assert "same stable worker id" in row.reason
    assert (job("restarted").worker_id, job("restarted").lease_epoch) == ("pod-0", 2)
    with pytest.raises(Conflict):
        store.finish("studio", "restarted", "pod-0", 1)
