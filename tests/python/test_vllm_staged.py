"""Staged syncs in the vLLM backend (docs/vllm.md, "Staged updates in vLLM"),
on CPU with the host transport: a real wsync-controller, a trainer
wsync-worker, vLLM ranks of the stand-in tiny Llama with their embedded
workers in this process, each replica driven by a stand-in of vLLM's
engine-core busy loop (vllm_staged_setup.EngineCoreLoop) whose forward reads
every weight of every rank all the time.

(a) While a version stages, generation goes on and every forward sees one
    whole version (the digest of every rank's weights per step equals V-1's
    or V's, never a mix); (b) the commit runs only between steps, inside the
    utility call; (d) with two TP ranks the engine steps again only once both
    committed; (c) a rolled-back version (a receiver replica killed after
    this rank staged, or the sender killed before anything staged) leaves the
    engine whole on V-1 and the events say so; (e) per replica the version the vLLM side serves
    equals the controller's, through rolling waves; a rank whose worker died
    between STAGED and its outcome is unsafe, and the engine refuses to resume
    generation until its next COMMITTED; a commit after vLLM slept wakes the
    weights first."""
import threading
import time

import pytest

from wsync import errors
from wsync._proto import controller_pb2 as pb
from wsync.vllm_staged import StagedEngine

from harness import freeze
from vllm_engine_setup import engine_mod  # noqa: F401
from vllm_staged_setup import TIMEOUT, StagedSetup


@pytest.fixture
def staged(cluster):
    """Makes StagedSetups on the test's cluster; closes them at the end."""
    made = []

    def make(**kwargs):
        made.append(StagedSetup(cluster, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


def driver(loop):
    """A StagedEngine driving `loop` through the extension route."""
    return StagedEngine(loop.collective_rpc, pause=loop.pause_generation,
                        resume=loop.resume_generation)


def commit_through_engine_route(s, eng, version):
    """Syncs `version` and commits it through vLLM's engine route (update
    info naming the version); returns the live digests it left."""
    eng.collective_rpc("start_weight_update")
    handle = s.client.sync(version)
    s.wait_decided(handle)
    eng.collective_rpc("update_weights", kwargs={"update_info": {"version": version}})
    eng.collective_rpc("finish_weight_update")
    handle.wait(timeout=TIMEOUT, show_progress=False)
    return s.live_digests()


def expect_rolled_back(sub, handle):
    """Version 2 rolled back on a replica serving 1: its event, a failed sync."""
    rolled = next_event(sub, "rolled_back", 2)
    assert rolled["serving_version"] == 1 and rolled["error"], rolled
    with pytest.raises(errors.WsyncError):
        handle.wait(timeout=TIMEOUT, show_progress=False)


def expect_whole_on_version_1(eng, t0, v1):
    """Committing version 2 is refused, and every step since t0 read v1."""
    with pytest.raises(errors.Aborted, match=r"version 2 .*whole on version 1"):
        eng.collective_rpc("update_weights", kwargs={"update_info": {"version": 2}})
    steps = [x for x in eng.steps if x[0] > t0]
    assert steps and all(x[2] == v1 for x in steps), "the engine left version 1"


def next_event(sub, kind, version, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        e = sub.next(0.2)
        if e is not None and e["kind"] == kind and e["version"] == version:
            return e
    raise AssertionError(f"no {kind} event of version {version} in {timeout} s")


def utility(engine, method, after):
    """The first `method` utility call that started after `after`."""
    return next(u for u in engine.utilities if u[0] == method and u[1] >= after)


def test_generation_goes_on_while_staging_and_the_commit_runs_between_steps(
        cluster, engine_mod, staged):  # noqa: F811
    s = staged(tp=2, route="engine")
    eng = s.engines[0]
    versions = {s.live_digests(): 0}
    subs = [s.receiver(i).events() for i in range(2)]
    for version in (1, 2):
        s.step(-0.5, float(version))
        want = s.version_digests()
        versions[want] = version
        t_start = time.monotonic()
        eng.collective_rpc("start_weight_update")  # no /pause: generation goes on
        handle = s.client.sync(version)
        staged_at = [next_event(sub, "staged", version)["monotonic"] for sub in subs]
        assert s.wait_decided(handle).commit_decided
        # The shadow holds the version on both ranks; the live weights do not.
        assert all(s.receiver(i).status()["staged_version"] == version for i in range(2))
        time.sleep(0.2)
        ran = [st for st in eng.steps if st[0] > max(staged_at)]
        assert ran and all(versions[st[2]] == version - 1 for st in ran), \
            "generation paused (or saw the new version) while the version was staged"
        info = {"version": version}
        if version == 2:  # the trainer's sync named (update_info sync_id)
            info["sync_id"] = handle.sync_id
        eng.collective_rpc("update_weights", kwargs={"update_info": info})
        eng.collective_rpc("finish_weight_update")
        assert handle.wait(timeout=TIMEOUT, show_progress=False).phase == pb.SYNC_SUCCEEDED
        call = utility(eng, "update_weights", t_start)
        commits = [s.receiver(i).last_commit for i in range(2)]
        done = [next_event(sub, "committed", version)["monotonic"] for sub in subs]
        # (b) Each rank's worker could write the live weights only while
        # admitted, inside the utility call; no forward overlapped it.
        for c in commits:
            assert c["version"] == version and c["outcome"] == "committed"
            assert call[1] <= c["admitted"] <= c["held"] <= call[2]
        # (d) The engine stepped again only once both ranks committed.
        assert max(done) <= call[2]
        assert not eng.steps_between(min(c["admitted"] for c in commits), max(done))
        time.sleep(0.2)
        after = [st for st in eng.steps if st[0] > call[2]]
        assert after and all(versions[st[2]] == version for st in after)
        assert s.live_digests() == want
        staging = [st for st in eng.steps if t_start < st[0] and st[1] < call[1]]
        print(f"version {version}: {len(staging)} steps ran from start_weight_update to the "
              f"commit call; commit pauses {[round(c['pause_s'] * 1e3, 2) for c in commits]} ms,"
              f" the utility call {round((call[2] - call[1]) * 1e3, 2)} ms")
        for i in range(2):
            st = s.receiver(i).status()
            assert (st["weight_version"], st["serving_version"], st["staged_version"],
                    st["unsafe"]) == (version, version, None, None)
    # (a) Every forward saw one whole version, and versions only went forward.
    seen = [versions.get(st[2]) for st in eng.steps]
    assert None not in seen, "a forward saw weights of no single version"
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 2
    kinds = [(e["kind"], e["version"]) for e in s.receiver(0).status()["history"]]
    assert kinds == [("staged", 1), ("commit", 1), ("committed", 1),
                     ("staged", 2), ("commit", 2), ("committed", 2)], kinds
    assert s.client.transfer_status("weights").last_success_version == 2


def test_a_rolled_back_version_leaves_the_engine_whole_on_the_old_one(
        cluster, engine_mod, staged):  # noqa: F811
    # Replica dp0: one vLLM rank; replica 1: a wsync-worker the test freezes,
    # so the pool cannot decide and the staged rank rolls back.
    s = staged(tp=1, sidecars=1, route="engine")
    eng, rx = s.engines[0], s.receiver(0)
    sub = rx.events()
    v1 = commit_through_engine_route(s, eng, 1)
    assert v1 == s.version_digests()
    s.step(2.0, -1.0)
    freeze(s.cluster.workers["inference:1:2"].proc)
    t0 = time.monotonic()
    handle = s.client.sync(2, deadline=20)
    next_event(sub, "staged", 2)
    eng.collective_rpc("start_weight_update")
    s.cluster.workers["inference:1:2"].proc.kill()
    expect_rolled_back(sub, handle)
    time.sleep(0.05)
    expect_whole_on_version_1(eng, t0, v1)
    st = rx.status()
    assert (st["weight_version"], st["serving_version"], st["staged_version"], st["unsafe"]) \
        == (1, 1, None, None)
    assert s.live_digests() == v1


def test_waves_and_served_versions_match_the_controller(cluster, staged):
    # Two replicas of two TP ranks, one replica committing at a time; the
    # driver commits each through the extension route (StagedEngine).
    s = staged(tp=2, dp=2, route="extension",
                rollout={"max_unavailable": 1, "replica_ranks": 2})
    engines = [driver(e) for e in s.engines]
    want = s.version_digests()
    handle = s.client.sync(1)
    s.wait_decided(handle)
    # Wave 0 (ranks 0-1) commits; wave 1 learns of the commit only by its
    # COMMIT, after wave 0 confirmed: it keeps serving 0 with 1 staged.
    assert engines[0].commit(1) == 1
    time.sleep(0.3)
    st0, st1 = engines[0].status(), engines[1].status()
    assert (st0["served_version"], st0["whole"]) == (1, True)
    assert (st1["served_version"], st1["staged_version"]) == (0, 1)
    ctl = {tuple(r.ranks): (r.version, r.state) for r in s.client.replica_versions()}
    assert ctl[(0, 1)] == (1, "serving"), ctl
    assert s.live_digests(0) == want and s.live_digests(1) != want
    assert engines[1].commit(1) == 1
    assert handle.wait(timeout=TIMEOUT, show_progress=False).phase == pb.SYNC_SUCCEEDED
    for d, e in enumerate(engines):
        ranks = tuple(r["membership"] for r in e.status()["ranks"])
        assert ranks == tuple(f"inference:{d * 2 + r}:4" for r in range(2))
    ctl = {tuple(r.ranks): (r.version, r.state) for r in s.client.replica_versions()}
    mine = {(2 * d, 2 * d + 1): (e.status()["served_version"], "serving")
            for d, e in enumerate(engines)}
    assert ctl == mine == {(0, 1): (1, "serving"), (2, 3): (1, "serving")}
    assert s.client.replicas_on(1) == [r.replica for r in s.client.replica_versions()]
    assert s.live_digests(1) == want


def test_an_unsafe_rank_keeps_generation_paused_until_its_next_commit(cluster, staged):
    s = staged(tp=2, route="extension")
    loop = s.engines[0]
    eng = driver(loop)
    handle = s.client.sync(1)
    s.wait_decided(handle)
    # Rank 1's embedded worker dies between STAGED and its outcome.
    sub = s.receiver(1).events()
    s.receiver(1).worker.stop()
    e = next_event(sub, "unsafe", 1)
    assert "stopped between STAGED of version 1" in e["error"]
    with pytest.raises(errors.FailedPrecondition, match="not whole.*inference:1:2 on 0 "
                                                         r"\(unsafe"):
        eng.commit(1, timeout=5)
    assert loop.paused and eng.blocked
    n = len(loop.steps)
    with pytest.raises(errors.FailedPrecondition, match="refusing to resume.*inference:1:2 "
                                                         "serves"):
        eng.resume()
    time.sleep(0.1)
    assert len(loop.steps) == n and loop.paused, "generation resumed on a mixed engine"
    # The rank comes back: still unsafe until its next COMMITTED.
    loop.collective_rpc("wsync_restart")
    assert eng.status()["unsafe"] == {"inference:1:2": s.receiver(1).status()["unsafe"]}
    with pytest.raises(errors.FailedPrecondition):
        eng.resume()
    s.client.wait_for_workers({"inference": 2}, timeout=30, buffers=True)
    handle.wait(timeout=TIMEOUT, show_progress=False)
    again = s.client.sync(1, resend=True)
    s.wait_decided(again)
    assert eng.commit(1, sync_id=again.sync_id) == 1
    again.wait(timeout=TIMEOUT, show_progress=False)
    assert eng.resume() == 1 and not loop.paused
    assert s.live_digests() == s.version_digests()
    end = time.monotonic() + 10
    while len(loop.steps) <= n and time.monotonic() < end:
        time.sleep(0.01)
    assert len(loop.steps) > n, "generation did not resume"


def test_a_commit_wakes_asleep_weights_first(cluster, engine_mod, staged):  # noqa: F811
    """vLLM slept (sleep mode: the weights offloaded and unmapped) while the
    next version staged: the commit wakes them before it writes, so the
    commit lands in mapped memory and no later wake restores the old
    contents over it."""
    import vllm_engine_standins as standins
    s = staged(tp=2, route="extension", sleep=True)
    loop, alloc = s.engines[0], standins.CuMemAllocator.get_instance()
    eng = driver(loop)
    handle = s.client.sync(1)
    s.wait_decided(handle)
    assert eng.commit(1, sync_id=handle.sync_id) == 1
    handle.wait(timeout=TIMEOUT, show_progress=False)
    loop.pause_generation()  # vLLM's sleep: the scheduler pauses, then the weights sleep
    alloc.sleep(offload_tags=("weights",))
    s.step(0.5, 2.0)
    handle = s.client.sync(2)  # stages into the shadows while the weights sleep
    s.wait_decided(handle)
    assert eng.commit(2, sync_id=handle.sync_id) == 2
    handle.wait(timeout=TIMEOUT, show_progress=False)
    assert ("wake_up", ["weights"]) in alloc.calls
    want = s.version_digests()
    assert s.live_digests() == want
    alloc.wake_up()  # vLLM's wake_up at resume: nothing is asleep any more
    assert s.live_digests() == want
    assert eng.resume() == 2


def test_a_sender_killed_mid_sync_rolls_back_before_anything_staged(
        cluster, engine_mod, staged):  # noqa: F811
    s = staged(tp=1, route="engine")
    eng, rx = s.engines[0], s.receiver(0)
    sub = rx.events()
    v1 = commit_through_engine_route(s, eng, 1)
    s.step(-1.0, 0.5)
    trainer = s.cluster.workers["trainer:0:1"].proc
    freeze(trainer)  # the sender cannot send: nothing stages
    t0 = time.monotonic()
    handle = s.client.sync(2)
    time.sleep(0.3)
    trainer.kill()
    expect_rolled_back(sub, handle)
    eng.collective_rpc("start_weight_update")
    expect_whole_on_version_1(eng, t0, v1)
    assert rx.status()["unsafe"] is None and rx.status()["serving_version"] == 1


def test_a_commit_call_whose_wait_ends_as_the_commit_begins_reports_its_outcome(
        cluster, staged):
    # Session 16's gap: the receiver's wait for the outcome could end (its
    # timeout) after the worker began the commit but before the receiver's
    # watch read COMMIT; it held again and said "nothing written" while the
    # worker copied. The race is forced: rank 0's first wait ends the moment
    # its worker published COMMIT (read on a raw subscription), as if its
    # watch had not read it yet; worker, controller and watch are real.
    s = staged(tp=2, route="extension")
    eng = driver(s.engines[0])
    rec = s.receiver(0)
    raw, seen, cond, stop = rec.worker.events(), [], threading.Condition(), threading.Event()

    def read():  # an owner reading at once (STAGED must be read before `staged`)
        while not stop.is_set():
            e = raw.next(0.1)
            if e is not None:
                with cond:
                    seen.append(e["kind"])
                    cond.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    real = rec._staged.wait_outcome

    def ends_at_commit(sync, end):
        rec._staged.wait_outcome = real  # only the first wait
        with cond:
            assert cond.wait_for(lambda: "commit" in seen, timeout=TIMEOUT)
        return None

    rec._staged.wait_outcome = ends_at_commit
    try:
        handle = s.client.sync(1)
        s.wait_decided(handle)
        assert eng.commit(1, timeout=30) == 1, "a commit that began was reported unwritten"
        assert rec.last_commit["outcome"] == "committed"
        assert handle.wait(timeout=TIMEOUT, show_progress=False).phase == pb.SYNC_SUCCEEDED
        assert s.live_digests() == s.version_digests()
    finally:
        stop.set()
        reader.join(5)
