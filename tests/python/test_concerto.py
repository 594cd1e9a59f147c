"""The Python package (python/, docs/python.md): programs, schedulers,
reports as the CLI's --json dicts, errors as concerto.Error."""
import array
import json
import os
import subprocess
import tempfile
import unittest

import concerto

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(os.environ.get("CONCERTO_BUILD", os.path.join(ROOT, "build")), "concerto")


class ProgramTest(unittest.TestCase):
    def test_lower_write_read_round_trip(self):
        p = concerto.lower("gpt-tiny", "dp=2,tp=2")
        self.assertEqual(p.num_ranks, 4)
        self.assertGreater(p.num_ops, 100)
        self.assertEqual(p.verify(), [])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.json")
            p.write(path)
            q = concerto.read_program(path)
        self.assertEqual(q.to_json(), p.to_json())
        self.assertEqual(concerto.parse_program(p.to_json()).num_ops, p.num_ops)
        self.assertEqual(p.to_dict()["format"], "concerto-ir")
        self.assertIn("gpt-tiny", repr(p))

    def test_catalogues(self):
        self.assertIn("gpt-tiny", concerto.models())
        self.assertIn("a800-4x8", concerto.clusters())
        self.assertIn("concerto", concerto.schedulers())
        names = [o["name"] for o in concerto.options()]
        self.assertIn("rounds", names)
        self.assertIn("memory-budget", names)


class SchedulerTest(unittest.TestCase):
    def test_simulate_is_the_cli_json(self):
        # The same job through the package and through `concerto simulate --json`: the same dict
        # but for the wall-clock seconds.
        p = concerto.lower("gpt-tiny", "dp=2,tp=2")
        got = concerto.simulate(p, cluster="a800-4x8", scheduler="ddp")
        self.assertGreater(got["makespan_us"], 0)
        self.assertEqual(got["cluster"], "a800-4x8")
        if not os.path.exists(CLI):
            self.skipTest("no CLI at " + CLI)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.json")
            p.write(path)
            out = subprocess.run([CLI, "simulate", path, "--cluster", "a800-4x8", "--scheduler", "ddp", "--json"],
                                 check=True, capture_output=True, text=True).stdout
        cli = json.loads(out)
        self.assertEqual(sorted(cli), sorted(got))
        self.assertEqual(cli["makespan_us"], got["makespan_us"])
        self.assertEqual(cli["options"], got["options"])

    def test_options_reach_the_scheduler(self):
        p = concerto.lower("gpt-tiny", "dp=2,tp=2")
        r = concerto.simulate(p, scheduler="concerto", options={"rounds": 1, "block": 20})
        self.assertEqual(r["options"]["rounds"], 1)
        self.assertEqual(r["options"]["block"], 20)
        self.assertLessEqual(r["concerto"]["rounds_run"], 1)
        # Sizes in words, as on the command line.
        r = concerto.simulate(p, scheduler="fifo", options={"memory-budget": "80GB"})
        self.assertEqual(r["options"]["memory-budget"], 80e9)

    def test_schedule_and_compare(self):
        p = concerto.lower("gpt-tiny", "dp=2")
        program, schedule = concerto.schedule(p, scheduler="concerto")
        self.assertEqual(program.verify(), [])
        self.assertEqual(schedule["scheduler"], "concerto")
        c = concerto.compare(p, schedulers=["fifo", "ddp", "concerto"])
        self.assertEqual([r["scheduler"] for r in c["results"]], ["fifo", "ddp", "concerto"])
        best_baseline = min(r["makespan_us"] for r in c["results"] if r["scheduler"] != "concerto")
        concerto_run = [r for r in c["results"] if r["scheduler"] == "concerto"][0]
        self.assertLessEqual(concerto_run["makespan_us"], best_baseline * (1 + 1e-9))

    def test_plan_search_ranks_fitting_plans(self):
        r = concerto.plan("gpt-tiny", cluster="a800-4x8", nodes=1, global_batch=8, search_top=1, top=50,
                          explain=True)
        self.assertEqual(r["devices"], 8)
        ranked = r["ranked"]
        self.assertGreater(len(ranked), 1)
        steps = [row["step_us"] for row in ranked]
        self.assertEqual(steps, sorted(steps))
        self.assertTrue(all(row["fits_memory"] for row in ranked))
        self.assertIn("concerto_step_us", ranked[0])
        # Every plan is accounted for, with a fate.
        self.assertEqual(len(r["every_plan"]), r["plans"])
        self.assertEqual(sum(r["fates"].values()), r["plans"])
        with self.assertRaisesRegex(concerto.Error, "objective"):
            concerto.plan("gpt-tiny", nodes=1, global_batch=8, objective="fastest")
        with self.assertRaisesRegex(concerto.Error, "global-batch"):
            concerto.plan("gpt-tiny", nodes=1)


class ErrorTest(unittest.TestCase):
    def test_errors_carry_the_library_message(self):
        with self.assertRaises(concerto.Error) as e:
            concerto.lower("gpt-tiny", "dp=3,tp=5")
        self.assertIn("gpt-tiny", str(e.exception))
        with self.assertRaisesRegex(concerto.Error, "no-such-file.json"):
            concerto.read_program("no-such-file.json")
        with self.assertRaisesRegex(concerto.Error, "broken.json:1:2: malformed JSON"):
            concerto.parse_program("{", source="broken.json")
        p = concerto.lower("gpt-tiny")
        with self.assertRaisesRegex(concerto.Error, "option --rounds"):
            concerto.simulate(p, scheduler="concerto", options={"rounds": -1})
        with self.assertRaisesRegex(concerto.Error, "unknown-option|unknown option"):
            concerto.simulate(p, options={"unknown-option": 1})
        with self.assertRaisesRegex(concerto.Error, "no-such-scheduler"):
            concerto.simulate(p, scheduler="no-such-scheduler")
        self.assertTrue(issubclass(concerto.Error, RuntimeError))


class AutodiffTest(unittest.TestCase):
    def test_differentiate_appends_the_backward(self):
        # gpt-tiny's forward alone (the hand-written backward and Adam dropped), then the
        # autodiff's backward with respect to two weights.
        d = concerto.lower("gpt-tiny").to_dict()
        g = d["graphs"][0]
        g["ops"] = [op for op in g["ops"] if op.get("tags", {}).get("phase") == "fwd"]
        used = {t for op in g["ops"] for t in op["inputs"] + op["outputs"]}
        g["tensors"] = [t for t in g["tensors"] if t["name"] in used]
        fwd = concerto.parse_program(json.dumps(d))
        loss = [op["outputs"][0] for op in g["ops"] if op.get("type") == "cross_entropy"][0]
        p, grads = concerto.differentiate(fwd, [(loss, 1.0)], ["L0.mlp.fc1.w", "embed.word.table"])
        self.assertEqual(sorted(grads), ["L0.mlp.fc1.w", "embed.word.table"])
        self.assertGreater(p.num_ops, fwd.num_ops)
        self.assertEqual(p.verify(), [])
        with self.assertRaisesRegex(concerto.Error, "no tensor 'nope'"):
            concerto.differentiate(fwd, [("nope", 1.0)], ["L0.mlp.fc1.w"])


class ExecuteTest(unittest.TestCase):
    def test_given_inputs_reach_every_rank_and_tensors_come_back_global(self):
        # gpt-tiny under dp=2, one step on the CPU runtime: a weight given as all zeros comes back
        # gathered as given; two schedules of the program compute the same loss.
        p = concerto.lower("gpt-tiny", "dp=2")
        w = next(t for t in p.to_dict()["graphs"][0]["tensors"] if t["name"] == "L0.mlp.fc1.w")
        zeros = [0.0] * (w["shape"][0] * w["shape"][1])
        a = concerto.execute(p, inputs={"L0.mlp.fc1.w": zeros}, fetch=["L0.mlp.fc1.w"])
        self.assertEqual(a["tensors"]["L0.mlp.fc1.w"]["values"], zeros)
        self.assertEqual(a["tensors"]["L0.mlp.fc1.w"]["shape"], w["shape"])
        self.assertEqual(a["tensors"]["L0.mlp.fc1.w"]["replica_error"], 0)
        self.assertGreater(a["loss"], 0)
        self.assertEqual(concerto.execute(p, scheduler="ddp")["loss"], concerto.execute(p)["loss"])

    def test_float32_buffers_in_and_out(self):
        # A float32 buffer (here the standard library's array; a numpy array is one too) is read
        # as the same values as a list; as_buffers=True gives the bytes of the float32 values.
        p = concerto.lower("gpt-tiny", "dp=2")
        w = next(t for t in p.to_dict()["graphs"][0]["tensors"] if t["name"] == "L0.mlp.fc1.w")
        values = [0.25 * (i % 7) for i in range(w["shape"][0] * w["shape"][1])]
        name = "L0.mlp.fc1.w"
        by_list = concerto.execute(p, inputs={name: values}, fetch=[name])
        by_buffer = concerto.execute(p, inputs={name: array.array("f", values)}, fetch=[name], as_buffers=True)
        self.assertEqual(by_buffer["loss"], by_list["loss"])
        got = by_buffer["tensors"][name]["values"]
        self.assertIsInstance(got, bytes)
        self.assertEqual(array.array("f", got).tolist(), by_list["tensors"][name]["values"])
        with self.assertRaisesRegex(concerto.Error, r"inputs\['L0.mlp.fc1.w'\]: a buffer of float32 values is "
                                                    r"needed, got format 'd'"):
            concerto.execute(p, inputs={name: array.array("d", values)})
        with self.assertRaisesRegex(concerto.Error, r"inputs\['L0.mlp.fc1.w'\]: a flat list of numbers or a "
                                                    r"float32 buffer is needed, got <class 'str'>"):
            concerto.execute(p, inputs={name: "zeros"})

    def test_errors_name_the_tensor(self):
        p = concerto.lower("gpt-tiny", "dp=1")
        with self.assertRaisesRegex(concerto.Error, r"tensor 'L0.mlp.fc1.w': 3 values given for 'L0.mlp.fc1.w', "
                                                    r"its global shape has \d+ elements"):
            concerto.execute(p, inputs={"L0.mlp.fc1.w": [1.0, 2.0, 3.0]})
        with self.assertRaisesRegex(concerto.Error, r"no rank of program .* has a tensor named 'nope'"):
            concerto.execute(p, fetch=["nope"])
        # a misspelt input was ignored (and the input generated instead)
        with self.assertRaisesRegex(concerto.Error, r"execute: inputs\['tokenz'\]: program '\S+' has no graph input "
                                                    r"of that name \(its inputs: "):
            concerto.execute(p, inputs={"tokenz": [1.0]})


if __name__ == "__main__":
    unittest.main()
