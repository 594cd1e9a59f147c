"""scripts/fuzz_capture.py: generated modules through concerto.torch.capture (issue 44).

A fixed seed and count (no clock): every module either captures and matches torch's step, or
is refused with a one-line concerto.Error naming its ATen node. Needs torch and the built module
(run on the torch interpreter: CMake's python_fuzz_capture). About 10 s.
"""
import os
import random
import sys
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import fuzz_capture  # noqa: E402


class FuzzCaptureTest(unittest.TestCase):
    def test_generated_modules_capture_or_are_refused_by_node(self):
        stats = fuzz_capture.fuzz(seed=0, count=150)
        self.assertEqual(stats["findings"], [])
        self.assertEqual(stats["modules"], 150)
        # Both paths were taken: modules with an unmapped op were refused, the rest captured.
        self.assertGreater(stats["refused"], 20)
        self.assertGreater(stats["captured"], 80)

    def test_the_checks_can_fail(self):
        # A generated module with an op capture does not map (linear, then cumsum).
        torch.manual_seed(0)
        module = fuzz_capture.Generated(["linear", "cumsum"], 4, 3, random.Random(0))
        x, labels = torch.randn(2, 5, 4), torch.randint(0, 3, (2, 5))
        # Told that every op is mapped, a refusal is a finding; told otherwise, it is not.
        outcome, finding = fuzz_capture.check_case(module, (x,), labels, unmapped=False)
        self.assertEqual(outcome, "refused")
        self.assertIn("every op is mapped but capture failed: capture: node 'cumsum' (aten.cumsum", finding)
        self.assertEqual(fuzz_capture.check_case(module, (x,), labels, unmapped=True), ("refused", None))

if __name__ == "__main__":
    unittest.main()
