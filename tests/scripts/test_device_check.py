"""scripts/device_check.sh --dry-run: the GPU check's CPU path (the engine twice on the CPU, three
tiny GEMMs against the cost model, a GEMM beside a copying thread) writes its JSON, the profile
record and the markdown section, and passes.

Needs an interpreter with torch (CONCERTO_TORCH_PYTHON, else scripts/setup_torch.sh's venv at
~/.cache/concerto/torch-venv) and the built module (CONCERTO_BUILD, else <repo>/build); skipped
without them. About 20 s.
"""
import json
import os
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "device_check.sh")
DEFAULT_VENV_PYTHON = os.path.expanduser("~/.cache/concerto/torch-venv/bin/python")


def torch_python():
    py = os.environ.get("CONCERTO_TORCH_PYTHON")
    if py:
        return py
    return DEFAULT_VENV_PYTHON if os.access(DEFAULT_VENV_PYTHON, os.X_OK) else None


def build_dir():
    return os.environ.get("CONCERTO_BUILD") or os.path.join(ROOT, "build")


def module_built(build):
    pkg = os.path.join(build, "python", "concerto")
    return os.path.isdir(pkg) and any(f.startswith("_concerto") for f in os.listdir(pkg))


PY = torch_python()
BUILD = build_dir()
SKIP = None
if PY is None:
    SKIP = ("no torch interpreter: CONCERTO_TORCH_PYTHON is not set and %s does not exist "
            "(bash scripts/setup_torch.sh makes it)" % DEFAULT_VENV_PYTHON)
elif not module_built(BUILD):
    SKIP = "the native module is not built in %s/python/concerto (set CONCERTO_BUILD)" % BUILD


def run_script(args, env_extra=None, timeout=300):
    env = dict(os.environ, CONCERTO_TORCH_PYTHON=PY)
    env.update(env_extra or {})
    return subprocess.run(["bash", SCRIPT, "--build", BUILD] + args, capture_output=True, text=True,
                          timeout=timeout, env=env)


@unittest.skipIf(SKIP, SKIP)
class DeviceCheckDryRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "dc")
        cls.proc = run_script(["--dry-run", "--out", cls.out])
        cls.report = cls.profile = cls.md = None
        if cls.proc.returncode == 0:
            with open(os.path.join(cls.out, "device_check.json")) as f:
                cls.report = json.load(f)
            with open(os.path.join(cls.out, "h100_profile.json")) as f:
                cls.profile = json.load(f)
            with open(os.path.join(cls.out, "device_check.md")) as f:
                cls.md = f.read()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.assertEqual(self.proc.returncode, 0, "device_check.sh --dry-run failed:\n" + self.proc.stderr[-4000:])

    def test_report_header(self):
        r = self.report
        self.assertEqual(r["format"], "concerto-device-check")
        self.assertTrue(r["dry_run"])
        self.assertTrue(r["ok"])
        self.assertEqual(r["failures"], [])
        self.assertEqual(r["device"]["kind"], "cpu")
        for key in ("torch_version", "date_utc", "total_s", "preset", "part_s"):
            self.assertIn(key, r)
        self.assertEqual(r["preset"]["name"], "h100-8x8")
        self.assertEqual(r["preset"]["peak_tflops_bf16"], 989.0)
        self.assertLess(r["total_s"], 60)

    def test_engine_part(self):
        e = self.report["parts"]["engine"]
        self.assertTrue(e["ok"])
        self.assertEqual(e["device"], "cpu")
        runs = {(r["model"], r["plan"], r["scheduler"]): r for r in e["runs"]}
        self.assertEqual(set(runs), {(m, p, s) for m, p in [("gpt-tiny", "dp=2"), ("llama-tiny", "dp=2"),
                                                             ("llama-tiny", "dp=2,zero=1")]
                                     for s in ("concerto", "fifo")})
        for key, r in runs.items():
            self.assertTrue(r["ok"], key)
            self.assertEqual(len(r["device_losses"]), e["steps"])
            self.assertEqual(len(r["reference_losses"]), e["steps"])
            self.assertLessEqual(r["max_rel_loss_diff"], 1e-3)
            self.assertGreater(r["num_collectives"], 0, key)
            self.assertEqual(r["collective_group_sizes"], [1], key)   # each collective: the rank alone
            self.assertGreater(r["device_step_ms_median"], 0)
            self.assertIn("comm.dp", r["ir_streams"])
        self.assertEqual(runs[("llama-tiny", "dp=2,zero=1", "fifo")]["rewrite"], "mesh+global-shapes")
        self.assertEqual(runs[("gpt-tiny", "dp=2", "fifo")]["rewrite"], "mesh")
        self.assertEqual(len(e["ir_dtype"]), 3)
        for r in e["ir_dtype"]:
            self.assertTrue(r["ok"] and r["finite"], r)
            self.assertLessEqual(r["rel_diff_first_loss_vs_f32"], 0.05)

    def test_gemm_part(self):
        g = self.report["parts"]["gemm"]
        self.assertTrue(g["ok"])
        self.assertEqual(g["timing"], "perf_counter")
        self.assertEqual(len(g["shapes"]), 3)
        for r in g["shapes"]:
            self.assertTrue(r["ok"], r)
            self.assertLessEqual(max(r["m"], r["n"], r["k"]), 256)
            self.assertEqual(r["flops"], 2 * r["m"] * r["n"] * r["k"])
            for key in ("measured_us", "achieved_tflops", "efficiency_vs_peak", "predicted_us", "model_efficiency",
                        "predicted_over_measured"):
                self.assertGreater(r[key], 0, key)
            self.assertAlmostEqual(r["predicted_over_measured"], r["predicted_us"] / r["measured_us"])
        self.assertGreater(g["median_predicted_over_measured"], 0)

    def test_interference_part(self):
        i = self.report["parts"]["interference"]
        self.assertTrue(i["ok"])
        self.assertEqual(i["model_interference"], 0.2)
        self.assertAlmostEqual(i["model_interference_simulated"], 0.2, places=6)
        self.assertGreater(i["gemm_alone_us"], 0)
        d2d = i["copy_d2d"]
        for key in ("gemm_beside_us", "copy_alone_gbps", "copy_beside_gbps"):
            self.assertGreater(d2d[key], 0, key)
        self.assertAlmostEqual(d2d["slowdown"], d2d["gemm_beside_us"] / i["gemm_alone_us"] - 1)
        self.assertEqual(i["copy_h2d"].get("skipped"), "skipped on CPU")

    def test_profile_record(self):
        p = self.profile
        self.assertEqual(p["device"], self.report["device"]["name"])
        self.assertEqual(len(p["gemm"]), 3)
        self.assertIn("not read by any code", p["note"])
        self.assertIsInstance(p["interference_copy_d2d"], float)
        self.assertIsNone(p["interference_copy_h2d"])

    def test_markdown_sections(self):
        md = self.md
        self.assertTrue(md.startswith("## Device check: dry run on the CPU"))
        for heading in ("### 1. The torch engine on the device", "### 2. GEMM efficiency across shapes",
                        "### 3. A kernel beside a copy", "### 4. Profile record"):
            self.assertIn("\n" + heading + "\n", md)
        self.assertIn(self.report["torch_version"], md)
        self.assertIn(self.report["date_utc"], md)
        self.assertIn("Result: **pass**", md)
        self.assertIn("No code reads it yet", md)
        # one table row per engine run, GEMM shape and copy
        self.assertEqual(md.count("| gpt-tiny | dp=2 |"), 3)
        self.assertEqual(md.count("| copy_"), 2)


@unittest.skipIf(SKIP, SKIP)
class DeviceCheckWithoutCuda(unittest.TestCase):
    def test_refuses_without_cuda(self):
        with tempfile.TemporaryDirectory() as tmp:
            p = run_script(["--out", tmp], env_extra={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
            self.assertEqual(p.returncode, 2, p.stderr[-2000:])
            self.assertIn("no CUDA device (use --dry-run for the CPU path)", p.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "device_check.json")))

    def test_bad_argument(self):
        p = run_script(["--frobnicate"], timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown argument", p.stderr)


if __name__ == "__main__":
    unittest.main()
