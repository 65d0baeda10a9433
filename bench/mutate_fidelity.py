"""Mutation table of the FedLGA-reading and GIFT-rule tests: each mutation must make its tests fail.

    python bench/mutate_fidelity.py            # 17 mutations, about 2-3 min of CPU

Each mutation is one textual change to a copy of the package in a temporary folder (the working
tree is never touched); the listed tests run against that copy, and the table says whether they
failed (they must) and how many of them did. A last row runs the same tests unmutated (they must pass).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
LGA = "hpcfl/algorithms/fedlga.py"
GRAD = "hpcfl/algorithms/fedlga_grad.py"
FULL = "tests/unit/test_fedlga_grad.py"
TAU = "hpcfl/algorithms/tau_control.py"
READINGS = "tests/unit/test_fedlga_readings.py"
CDEP = "tests/unit/test_gift_c_dependence.py"
LITERAL = "tests/unit/test_tau_control.py::test_B1_literal_relaxation_has_no_phase_switch_and_no_cap"

# (name, file, old, new, tests)
MUTATIONS = [
    ("B_alg1 given C's signs", LGA, '"B_alg1": (1.0, -1.0)', '"B_alg1": (-1.0, 1.0)', [READINGS]),
    ("B_alg1 given A's signs", LGA, '"B_alg1": (1.0, -1.0)', '"B_alg1": (1.0, 1.0)', [READINGS]),
    ("C_pseudo given B's signs", LGA, '"C_pseudo": (-1.0, 1.0)', '"C_pseudo": (1.0, -1.0)', [READINGS]),
    ("A_table1 given B's signs", LGA, '"A_table1": (1.0, 1.0)', '"A_table1": (1.0, -1.0)', [READINGS]),
    ("last_grad ignored (g = D / (lr S))", LGA, "        g = grad\n",
     "        g = D / (lr * steps)\n", [READINGS]),
    ("last gradient taken at x^t, not x^t + D", GRAD,
     ("c.model.load(c.x0 + res.delta)\n    c.model.module.train()\n    x, y"),
     "c.model.load(c.x0)\n    c.model.module.train()\n    x, y", [READINGS]),
    ("full_grad computed by last_gradient", LGA, '{"full_grad": full_gradient', '{"full_grad": last_gradient', [FULL]),
    ("full_grad on one batch", GRAD, "    for lo in range(0, n, chunk):\n        hi = min(lo + chunk, n)\n",
     "    for lo in (0,):\n        hi = n = min(c.trainer.batch_size, n)\n", [FULL]),
    ("full_grad with weight decay", GRAD, "    return (total / n).cpu().numpy()",
     "    return (total / n + c.weight_decay * c.model.weights.detach().double()[:P]).cpu().numpy()", [FULL]),
    ("full_grad taken at x^t, not x^t + D", GRAD,
     ("c.model.load(c.x0 + res.delta)\n    c.model.module.train()\n    total"),
     "c.model.load(c.x0)\n    c.model.module.train()\n    total", [FULL]),
    ("full_grad's pass not charged to the clock", LGA, "        return full_steps_of_pass(ctx.sizes, self.batch_size)",
     "        return None", [FULL]),
    ("B_alg1 guard removed", LGA, 'return 0.0 if self.variant == "B_alg1"', 'return -np.inf if self.variant == "B_alg1"',
     [READINGS]),
    ("literal: phase switch restored", TAU, "(literal or self.phase", "(self.phase", [LITERAL]),
    ("literal: cap at 10 tau0 restored", TAU, "            self.tau += self.delta\n",
     "            self.tau = min(self.tau_max, self.tau + self.delta)\n", [LITERAL]),
    ("stagnation rule ignores eps_rel", TAU, "C < self.c_min - max(self.eps_abs, self.eps_rel * self.c_min)",
     "C < self.c_min - self.eps_abs", [CDEP]),
    ("stagnation never halves", TAU, "        if stagnated and self.tau > self.tau_min:",
     "        if False:", [CDEP]),
    ("controller ignores C (halves every 20 rounds)", TAU, "        if stagnated and self.tau > self.tau_min:",
     "        if self.r % 20 == 0 and self.tau > self.tau_min:", [CDEP]),
]


def run_tests(tree: pathlib.Path, tests: list[str]) -> tuple[bool, str]:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin:" + str(pathlib.Path(sys.executable).parent)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=tree,
                         capture_output=True, text=True, env=env, check=False)
    last = [ln for ln in out.stdout.splitlines() if " passed" in ln or " failed" in ln or " error" in ln]
    return out.returncode == 0, (last[-1] if last else out.stdout[-200:]).strip()


def main() -> None:
    print("| mutation | file | tests | result |")
    print("|---|---|---|---|")
    ok = True
    for name, path, old, new, tests in [*MUTATIONS, ("none (control)", LGA, "", "", [READINGS, CDEP, LITERAL, FULL])]:
        with tempfile.TemporaryDirectory() as tmp:
            tree = pathlib.Path(tmp)
            for part in ("hpcfl", "tests", "docs", "setup.cfg"):   # docs: the labels test reads fedlga.md
                src = ROOT / part
                (shutil.copytree if src.is_dir() else shutil.copy)(src, tree / part)
            text = (tree / path).read_text()
            if old:
                if text.count(old) != 1:
                    raise SystemExit(f"mutation {name!r}: {old!r} occurs {text.count(old)} times in {path}")
                (tree / path).write_text(text.replace(old, new))
            passed, summary = run_tests(tree, tests)
        want_pass = not old
        ok &= passed == want_pass
        verdict = ("passes (as it must)" if passed else "FAILS (wrong)") if want_pass else \
            ("killed: " if not passed else "SURVIVED: ") + summary
        print(f"| {name} | {path} | {', '.join(t.split('::')[-1].removeprefix('tests/unit/') for t in tests)} | "
              f"{verdict} |", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
