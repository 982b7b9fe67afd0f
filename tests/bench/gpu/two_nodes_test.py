#!/usr/bin/env python3
"""bench/gpu/two_nodes.py on the GPU benches' RESULT lines (their printf formats in
bench/gpu/nccl_ceiling.cc and ipc_put_bench.cc), so the GPU-only step of
run_two_nodes.sh is parsed in CI too; and compare/summary on a demo log."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "gpu", "two_nodes.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def result(d):
    return "RESULT " + json.dumps(d, separators=(",", ":")) + "\n"


def sendrecv(case, nbytes, gbps, both=False):
    return result({"bench": "nccl_ceiling", "case": case, "bytes": nbytes, "pieces": 1,
                   "both_directions": both, "median_s": nbytes / gbps / 1e9, "min_s": 0.1,
                   "gbps": gbps, "iters": 3})


class TwoNodesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.d = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def read(self, path):
        with open(path) as f:
            return f.read()

    def write(self, name, text):
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def net_log(self):
        pattern = {"bench": "nccl_ceiling", "case": "pairs_0to2_1to3_1GiB", "gpus": 4,
                   "busiest_gpu": 0, "busiest_bytes_in": 0, "busiest_bytes_out": 1 << 30,
                   "median_s": 0.5, "gbps": 2.2, "iters": 3}
        group = {"bench": "nccl_ceiling", "case": "group_64x16MiB", "bytes": 1 << 30,
                 "pieces": 64, "both_directions": False, "median_s": 1, "min_s": 1, "gbps": 1.1,
                 "iters": 3}
        copies = "".join(result({"bench": "device_copy", "rank": r, "bytes": 1 << 30,
                                 "memcpy_median_s": 0.0005, "memcpy_gbps": g,
                                 "kernel_median_s": 0.0006, "kernel_gbps": 1800.0})
                         for r, g in ((0, 2100.0), (1, 2080.0)))
        return self.write("net.log", "NCCL INFO noise\n"
                          + sendrecv("sendrecv_1GiB", 1 << 30, 5.0)
                          + sendrecv("sendrecv_256MiB", 256 << 20, 3.9)
                          + sendrecv("sendrecv_16MiB", 16 << 20, 2.9)
                          + sendrecv("bidirectional_1GiB", 1 << 30, 2.0, both=True)
                          + result(group) + result(pattern) + copies)

    def test_rates_from_the_gpu_benches(self):
        nvl = self.write("nvl.log", sendrecv("sendrecv_256MiB", 256 << 20, 356.0))
        ipc = self.write("ipc.log", "".join(result(
            {"bench": "ipc_put", "processes": 2, "case": c, "peer_bytes": 1207959552,
             "local_bytes": local, "median_s": s, "iters": 5}) for c, local, s in (
            ("push_ce", 0, 0.0040), ("pull_ce", 0, 0.0020), ("push_kernel8", 0, 0.0035),
            ("push_ce+local_kernel", 6822301696, 0.0010))))
        p = run("rates", "--net", self.net_log(), "--nvlink", nvl, "--ipc", ipc)
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout)
        self.assertEqual(r["nic_gbps"], 3.9)
        self.assertEqual(r["nic_gbps_16MiB"], 2.9)
        self.assertEqual(r["nic_gbps_1GiB"], 5.0)
        self.assertEqual(r["nic_patterns"], {"bidirectional_1GiB": 2.0, "group_64x16MiB": 1.1,
                                             "pairs_0to2_1to3_1GiB": 2.2})
        self.assertEqual(r["nic_gbps_shared"]["fanout_dp2"], 2.2)
        self.assertIsNone(r["nic_gbps_shared"]["colocated4"])  # no all-to-all in this log
        rates = self.write("rates.json", json.dumps(r))
        self.assertEqual(run("shared", "--rates", rates, "--case", "fanout_dp2").stdout, "2.2\n")
        self.assertEqual(run("shared", "--rates", rates, "--case", "colocated4").stdout, "")
        # The fastest push alone (pull is not how wsync writes; with a local copy is not alone).
        self.assertAlmostEqual(r["nvlink_gbps"], round(1207959552 / 0.0035 / 1e9, 1))
        self.assertIn("push_kernel8", r["nvlink_source"])
        self.assertEqual(r["copy_gbps"], 2080.0)
        self.assertEqual(r["nccl_nvlink_gbps_256MiB"], 356.0)
        # Without ipc_put: NCCL over NVLink.
        p = run("rates", "--net", self.net_log(), "--nvlink", nvl)
        self.assertEqual(json.loads(p.stdout)["nvlink_gbps"], 356.0)
        # No NIC result: an error, not a made-up rate.
        p = run("rates", "--net", nvl + ".missing", "--nvlink", nvl)
        self.assertNotEqual(p.returncode, 0)

    def test_compare_and_summary(self):
        rates = self.write("rates.json", json.dumps(
            {"nvlink_gbps": 300.0, "nic_gbps": 4.0, "copy_gbps": 2000.0}))
        demo = self.write("demo.log", "".join(result(
            {"bench": "wsync_demo", "version": v, "bytes": 268000000, "wall_s": 0.2,
             "execute_s": t, "elapsed_s": t + 0.01, "setup_s": 0, "direct_pairs": 1,
             "checked_bytes": 536000000, "wrong": 0})
            for v, t in ((1, 0.5), (2, 0.070), (3, 0.072), (4, 0.090)))
            + "OK: every destination byte verified\n")
        plan = self.write("plan.txt", 'plan x\nSIM {"makespan_s":0.067,"bound_s":0.067,'
                          '"bound_worker":0,"bound_link":"nic_out","rounds":1,'
                          '"network_bytes":1,"local_bytes":0,"nccl_net":true,'
                          '"nvlink_pairs":"0->1"}\n')
        p = run("compare", "--case", "fanout", "--demo", demo, "--plan", plan, "--rates", rates)
        self.assertEqual(p.returncode, 0, p.stderr)
        row = json.loads(p.stdout)
        self.assertTrue(row["ok"])
        self.assertEqual(row["versions"], 4)
        self.assertAlmostEqual(row["measured_execute_s"], 0.072)  # median of v2..v4
        self.assertAlmostEqual(row["ratio"], 0.072 / 0.067)
        self.assertEqual(row["note"], "")
        self.assertEqual(row["first_execute_s"], 0.5)
        # A gap over 10 % and a pair count the simulator disagrees with are flagged.
        slow = self.write("slow.txt", self.read(plan).replace('"0->1"', '"0->1,1->0"')
                          .replace("0.067", "0.05"))
        row = json.loads(run("compare", "--case", "fanout", "--demo", demo, "--plan", slow,
                             "--rates", rates).stdout)
        self.assertIn("GAP > 10 %", row["note"])
        self.assertIn("wrote 1 pairs directly, the simulator put 2", row["note"])
        left = self.write("left.txt", self.read(plan).replace(
            '"nvlink_pairs":"0->1"}', '"nvlink_pairs":"0->1","same_node_transport_pairs":"1->0"}'))
        row = json.loads(run("compare", "--case", "fanout", "--demo", demo, "--plan", left,
                             "--rates", rates).stdout)
        self.assertIn("same-node pairs on NCCL sockets: 1->0", row["note"])
        # A failed demo (no OK line) fails the comparison.
        bad = self.write("bad.log", self.read(demo).replace("OK: every", "FAILED"))
        p = run("compare", "--case", "fanout", "--demo", bad, "--plan", plan, "--rates", rates)
        self.assertNotEqual(p.returncode, 0)
        jsonl = self.write("rows.jsonl", json.dumps(row) + "\n")
        s = run("summary", jsonl)
        self.assertEqual(s.returncode, 0, s.stderr)
        self.assertIn("NIC (NCCL forced onto sockets) 4.0 GB/s", s.stdout)
        self.assertRegex(s.stdout, r"fanout +268\.0 +72\.00")


if __name__ == "__main__":
    unittest.main()
