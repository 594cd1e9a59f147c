"""scripts/torchbed.sh's smoke (what CI runs of `make torchbed`): every workload at the tiny size,
2 rounds of one timed step, on the plain loopback (NETNS=0: no root, no shaping). Every variant
(torch's DDP, FSDP and tensor parallelism, the engine's ddp/zero/megatron/concerto schedules)
trains, the final losses of a workload's variants agree within fp32 rounding, and every engine row
has the simulator's prediction. The summary's checks are tested on doctored inputs too.

Needs an interpreter with torch (CONCERTO_TORCH_PYTHON, else scripts/setup_torch.sh's venv) and
the build (CONCERTO_BUILD: concerto, concerto_mpi_run, the module); skipped without them. About
2 minutes on 2 cores.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from test_device_check import BUILD, PY, ROOT, SKIP  # noqa: E402  (the same interpreter and build lookup)

SCRIPT = os.path.join(ROOT, "scripts", "torchbed.sh")
TORCHBED = os.path.join(ROOT, "scripts", "torchbed.py")
WORKLOADS = ["gpt2-dp2", "gpt2-zero3", "llama-tp2"]


@unittest.skipIf(SKIP is not None, SKIP or "")
class TorchbedSmoke(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp(prefix="torchbed-smoke-")
        # The profile at its quickest (one rep, one kernel pass, collectives up to 1 MiB).
        env = dict(os.environ, NETNS="0", SIZE="tiny", ROUNDS="2", WARMUP="1", STEPS="1",
                   WORKLOADS=" ".join(WORKLOADS), OUT=cls.out, PY=PY, PROFILE_REPS="1", KERNEL_PASSES="1",
                   MAX_BYTES="1048576")
        cls.result = subprocess.run(["bash", SCRIPT, BUILD], env=env, cwd=ROOT, capture_output=True, text=True,
                                 timeout=1200)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def summary(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-4000:])
        with open(os.path.join(self.out, "torchbed.json")) as f:
            return {w["workload"]: w for w in json.load(f)["workloads"]}

    def test_every_variant_trains_to_the_same_loss(self):
        got = self.summary()
        self.assertEqual(sorted(got), sorted(WORKLOADS))
        torch_rows = {"gpt2-dp2": {"ddp-25mb", "ddp-1mb", "ddp-5mb", "ddp-100mb"},
                      "gpt2-zero3": {"fsdp", "fsdp-prefetch"}, "llama-tp2": {"tp"}}
        for name, w in got.items():
            variants = {r["variant"] for r in w["rows"]}
            engine = {"engine-" + s for s in ("ddp", "zero", "megatron", "concerto")}
            self.assertEqual(variants, torch_rows[name] | engine, name)
            # 2 rounds x (1 + 1) steps of Adam from one init on one batch sequence.
            self.assertLess(w["max_final_loss_rel_diff"], 1e-4, name)
            for r in w["rows"]:
                self.assertGreater(r["median_ms"], 0, (name, r))
                self.assertLessEqual(r["min_ms"], r["median_ms"])
                self.assertLessEqual(r["median_ms"], r["max_ms"])
                if r["variant"].startswith("engine-"):
                    self.assertGreater(r["predicted_ms"], 0, (name, r))

    def test_the_engine_profile_holds_torch_kernels_and_gloo_collectives(self):
        self.summary()
        d = os.path.join(self.out, "unshaped", "gpt2-dp2")
        with open(os.path.join(d, "torch.summary.json")) as f:
            update = json.load(f)
        kinds = {c["signature"].split("|")[0] for c in update["changes"]}
        self.assertIn("matmul", kinds)
        self.assertIn("all_reduce", kinds)  # --collectives: gloo's spans, not MPI's fit


class SummaryChecks(unittest.TestCase):
    """torchbed.py summary on hand-made measurements: losses that disagree, a missing prediction."""

    def write(self, d, losses, simulated):
        os.makedirs(d, exist_ok=True)
        variants = {v: {"median_ms": 10.0 + i, "min_ms": 9.0 + i, "max_ms": 11.0 + i, "final_loss": loss,
                        "round_median_ms": [10.0 + i], "step_ms": [10.0 + i], "losses": [loss]}
                    for i, (v, loss) in enumerate(losses.items())}
        with open(os.path.join(d, "measured.json"), "w") as f:
            json.dump({"workload": "gpt2-dp2", "size": "tiny", "rounds": 1, "steps": 1, "variants": variants,
                       "order": list(losses)}, f)
        for v, ms in simulated.items():
            with open(os.path.join(d, v + ".simulated.json"), "w") as f:
                json.dump({"makespan_us": ms * 1e3}, f)

    def summary(self, d, *extra):
        return subprocess.run([sys.executable, TORCHBED, "summary", d, "--json"] + list(extra), capture_output=True,
                              text=True)

    def test_ranking_error_and_loss_checks(self):
        with tempfile.TemporaryDirectory() as d:
            # ddp-25mb 10 ms (9-11); engine-ddp 11 (10-12), predicted 13.2 (+20%); engine-concerto
            # 12 (11-13), predicted 12.0 (0%). The engine rows' ranges overlap: no ranked pair.
            self.write(d, {"ddp-25mb": 3.0, "engine-ddp": 3.0, "engine-concerto": 3.0},
                       {"engine-ddp": 13.2, "engine-concerto": 12.0})
            r = self.summary(d, "--max-loss-diff", "1e-6")
            self.assertEqual(r.returncode, 0, r.stderr)
            w = json.loads(r.stdout.splitlines()[-1])["workloads"][0]
            rows = {x["variant"]: x for x in w["rows"]}
            self.assertAlmostEqual(rows["engine-ddp"]["error_pct"], 20.0)
            self.assertAlmostEqual(rows["engine-concerto"]["error_pct"], 0.0)
            self.assertEqual(w["ranked_pairs"], 0)
            self.assertEqual(w["best_torch"], "ddp-25mb")
            self.assertAlmostEqual(w["concerto_vs_best_torch"], 10.0 / 12.0)
            self.assertEqual(w["rows_within_10pct"], 1)

            self.write(d, {"ddp-25mb": 3.0, "engine-ddp": 3.001, "engine-concerto": 3.0},
                       {"engine-ddp": 13.2, "engine-concerto": 12.0})
            r = self.summary(d, "--max-loss-diff", "1e-6")
            self.assertEqual(r.returncode, 1)
            self.assertIn("final losses differ by 0.000333", r.stderr)

            os.remove(os.path.join(d, "engine-concerto.simulated.json"))
            r = self.summary(d)
            self.assertEqual(r.returncode, 1)
            self.assertIn("no prediction for engine-concerto", r.stderr)

    def test_a_misranked_pair_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            # Measured (median, min-max): a 10 (9-11), b 11 (10-12), c 12 (11-13), d 13 (12-14). Only
            # a and d have ranges apart (11 < 12): one ranked pair, a faster; predicted a 20 > d 13.
            self.write(d, {"engine-a": 1.0, "engine-b": 1.0, "engine-c": 1.0, "engine-d": 1.0},
                       {"engine-a": 20.0, "engine-b": 11.0, "engine-c": 12.0, "engine-d": 13.0})
            w = json.loads(self.summary(d).stdout.splitlines()[-1])["workloads"][0]
            self.assertEqual(w["ranked_pairs"], 1)
            self.assertIn(["engine-a", "engine-d"], w["misranked_pairs"])  # measured faster, predicted slower
            self.assertNotIn(["engine-b", "engine-d"], w["misranked_pairs"])


if __name__ == "__main__":
    unittest.main()
