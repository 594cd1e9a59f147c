"""scripts/testbed_summary.py on a tiny testbed folder, the expected figures worked out beside it."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "testbed_summary.py")

# One workload, two schedules (ms; compute busy in brackets):
#   sequential: measured 1000 (990-1010) [500]; first 1050 [550] -> +5.0%;
#               rounds 950, 1000 [500, 500] -> per_round 975 -> -2.5%; merged 980 -> -2.0%
#   fifo:       measured 800 (790-810) [400];   first 900 [440]  -> +12.5%;
#               rounds 810, 790 [400, 400]  -> per_round 800 -> 0%;    merged 800 -> 0%
# First within 10%: 1 of 2; per_round 2 of 2. The two measured ranges do not
# overlap: one separable pair, in the measured order in every prediction.
# The first profile's compute per step against the rounds': 550 / 500 and
# 440 / 400, both +10%: the median +10.0%.
CELLS = {
    "sequential": {"measured": (1000, 990, 1010, 500), "first": (1050, 550), "rounds": [(950, 500), (1000, 500)],
                   "merged": (980, 500)},
    "fifo": {"measured": (800, 790, 810, 400), "first": (900, 440), "rounds": [(810, 400), (790, 400)],
             "merged": (800, 400)},
}


class TestbedSummary(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        w = os.path.join(self.dir.name, "w")
        os.makedirs(w)

        def write(name, obj):
            with open(os.path.join(w, name), "w") as f:
                json.dump(obj, f)

        def sim(ms, busy):
            return {"makespan_us": ms * 1e3, "compute_busy_us": busy * 1e3}

        for s, c in CELLS.items():
            med, lo, hi, busy = c["measured"]
            write(s + ".measured.json", {"median_iteration_us": med * 1e3, "min_iteration_us": lo * 1e3,
                                         "max_iteration_us": hi * 1e3, "compute_busy_us": busy * 1e3})
            write(s + ".simulated.json", sim(*c["first"]))
            for r, rr in enumerate(c["rounds"], 1):
                write("%s.round-%d.simulated.json" % (s, r), sim(*rr))
            write(s + ".merged.simulated.json", sim(*c["merged"]))

    def tearDown(self):
        self.dir.cleanup()

    def test_errors_ranking_and_drift(self):
        p = subprocess.run([sys.executable, SCRIPT, self.dir.name, "w=dp=2"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| dp=2 | sequential | 1000.0 (990.0-1010.0) | 1050.0 | +5.0% | 975.0 | -2.5% | 980.0 | -2.0%",
                      p.stdout)
        self.assertIn("| dp=2 | fifo | 800.0 (790.0-810.0) | 900.0 | +12.5% | 800.0 | +0.0% |", p.stdout)
        self.assertIn("- dp=2, first: 1 of 2 cells within 10%; ranking: 1 of 1 separable pairs", p.stdout)
        self.assertIn("- dp=2, per_round: 2 of 2 cells within 10%", p.stdout)
        self.assertIn("- dp=2: the first profile's kernels against the rounds' (simulated compute per step): +10.0%",
                      p.stdout)
        with open(os.path.join(self.dir.name, "testbed.json")) as f:
            out = json.load(f)
        self.assertEqual(out["cells_within_10pct_first"], 1)
        self.assertAlmostEqual(out["workloads"][0]["first_profile_kernel_drift"], 0.10)


if __name__ == "__main__":
    unittest.main()
