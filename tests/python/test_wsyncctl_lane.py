"""`wsyncctl sync --lane` (or WSYNC_CONTROLLER_LANE): the Sync goes over the
controller's control fast lane, with the same answer, exit code and errors
as over gRPC; an absent lane warns and the call goes over gRPC. Real
controller and workers reporting on the lane."""
import json
import os
import subprocess

from harness import WSYNCCTL_BIN
from lane_setup import TRAINER, lane_cluster, unreachable_address  # noqa: F401,F811
from test_lane_python import ready


def ctl(address, *args, env=None):
    return subprocess.run([WSYNCCTL_BIN, "sync", f"--controller={address}", "--insecure",
                           f"--token={TRAINER}", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_wsyncctl_sync_over_the_lane(lane_cluster):
    _, regs = ready(lane_cluster)  # noqa: F841
    far = unreachable_address()  # gRPC cannot reach the controller: only the lane can
    ok = ctl(far, "t", "1", "--wait", "--json", f"--lane={lane_cluster.lane}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    status = json.loads(ok.stdout)
    assert status["phase"] == "SYNC_SUCCEEDED" and status["round_trip_ms"] > 0
    by_env = ctl(far, "t", "2", "--wait", env={"WSYNC_CONTROLLER_LANE": lane_cluster.lane})
    assert by_env.returncode == 0 and "SUCCEEDED" in by_env.stdout, by_env.stdout + by_env.stderr
    older = ctl(far, "t", "1", "--wait", f"--lane={lane_cluster.lane}")
    assert older.returncode == 1
    assert "FAILED_PRECONDITION" in older.stderr and "(over the lane)" in older.stderr, older.stderr
    # An absent lane: a warning, then gRPC.
    absent = ctl(lane_cluster.address, "t", "3", "--wait", f"--lane={lane_cluster.lane}.absent")
    assert absent.returncode == 0, absent.stdout + absent.stderr
    assert "absent: No such file" in absent.stderr and "goes over gRPC" in absent.stderr
    logs = lane_cluster.logs()
    assert logs.count("reports over the control lane") == 3, logs
