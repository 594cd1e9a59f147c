"""scripts/trace_compare.py on tiny traces, the expected figures worked out beside them."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "trace_compare.py")


def event(name, rank, kind, ts, dur, type_="", phase=""):
    return {"name": name, "ph": "X", "pid": rank, "tid": 0, "ts": ts, "dur": dur,
            "args": {"kind": kind, "type": type_, "phase": phase}}


# Rank 0, run (us):
#   compute  |a: 0-1000|b: 1000-3000|
#   comm                  |ar: 1200 ---------- 3800|
# b has 1800 of its 2000 us beside ar (90% is not > 90%: "part"); a none.
# Simulated: a 1000, b 1000. So a ratio 1.0, b 2.0; ar ends 800 us after
# the compute stopped (3000), with 1800 us of compute beside its 2600.
SIM = [event("a", 0, "compute", 0, 1000, "matmul", "fwd"),
       event("b", 0, "compute", 1000, 1000, "gelu", "fwd"),
       event("ar", 0, "collective", 2000, 500)]
RUN = [event("a", 0, "compute", 0, 1000, "matmul", "fwd"),
       event("b", 0, "compute", 1000, 2000, "gelu", "fwd"),
       event("ar", 0, "collective", 1200, 2600)]


class TraceCompare(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.sim = self.write("sim.json", {"traceEvents": SIM})
        self.run_trace = self.write("run.json", {"traceEvents": RUN})

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, obj):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj))
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)

    def test_kernels_ratio_per_type(self):
        p = self.run_script("kernels", self.sim, self.run_trace, "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = {r["type"]: r for r in json.loads(p.stdout)["kernels"]}
        self.assertAlmostEqual(rows["gelu"]["ratio"], 2.0)
        self.assertAlmostEqual(rows["matmul"]["ratio"], 1.0)
        self.assertAlmostEqual(rows["gelu"]["measured_ms"], 2.0)

    def test_overlap_classes(self):
        p = self.run_script("overlap", self.sim, self.run_trace, "--min-us", "0", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        got = {r["class"]: r for r in json.loads(p.stdout)["classes"]}
        self.assertEqual(got["none"]["ops"], 1)   # a
        self.assertEqual(got["part"]["ops"], 1)   # b: 1800 / 2000 = 90%, not above
        self.assertNotIn("overlapped", got)

    def test_comm_tail(self):
        p = self.run_script("comm-tail", self.run_trace, "--match", "ar", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        row = out["comm"][0]
        self.assertAlmostEqual(row["compute_beside_ms"], 1.8)
        self.assertAlmostEqual(row["end_after_compute_ms"], 0.8)
        self.assertAlmostEqual(out["summary"]["median_end_after_compute_ms"], 0.8)

    def test_jitter(self):
        # Two ranks (us):
        #   rank 0 |c 0-1000|ar1|d 1000-3000|ar2|
        #   rank 1 |c 0-1200|ar1|d 1200-3200|ar2|
        # ar1: compute 1000 and 1200, mean 1100, slowest 100 past it: spread
        # 100 / 1100 = 0.0909; ar2: 2000 and 2000, spread 0. With --min-us 0
        # both count: mean spread 0.04545, over e_2 = 1 / sqrt(pi) = 0.5642:
        # 0.0806; the slowest ranks took 0.1 ms past the mean in all.
        trace = [event("c", 0, "compute", 0, 1000), event("ar1", 0, "collective", 1000, 10),
                 event("d", 0, "compute", 1010, 2000), event("ar2", 0, "collective", 3010, 10),
                 event("c", 1, "compute", 0, 1200), event("ar1", 1, "collective", 1200, 10),
                 event("d", 1, "compute", 1210, 2000), event("ar2", 1, "collective", 3210, 10)]
        path = self.write("two.json", {"traceEvents": trace})
        p = self.run_script("jitter", path, "--min-us", "0", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertAlmostEqual(out["collectives"][0]["spread"], 100 / 1100)
        self.assertAlmostEqual(out["summary"]["e_n"], 0.5641896, places=5)
        self.assertAlmostEqual(out["summary"]["compute_jitter"], (100 / 1100 / 2) / 0.5641896, places=4)
        self.assertAlmostEqual(out["summary"]["slowest_past_mean_ms"], 0.1)
        # The default --min-us 2000 counts only ar2.
        out = json.loads(self.run_script("jitter", path, "--json").stdout)
        self.assertEqual(out["summary"]["counted"], 1)
        self.assertAlmostEqual(out["summary"]["compute_jitter"], 0.0)
        p = self.run_script("jitter", self.run_trace)
        self.assertEqual(p.returncode, 2)
        self.assertIn("one rank", p.stderr)

    def test_bad_input_names_the_file(self):
        bad = self.write("bad.json", "{not json")
        p = self.run_script("kernels", bad, self.run_trace)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.json: not JSON", p.stderr)
        other = self.write("other.json", {"traceEvents": [event("zz", 0, "compute", 0, 5)]})
        p = self.run_script("kernels", other, self.run_trace)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no compute op in common", p.stderr)
        p = self.run_script("comm-tail", self.run_trace, "--match", "nothing")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no communication op whose name contains 'nothing'", p.stderr)


if __name__ == "__main__":
    unittest.main()
