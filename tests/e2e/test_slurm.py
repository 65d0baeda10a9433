"""The Slurm templates in slurm/, run without Slurm: stand-in srun/scontrol on PATH, a stand-in
for hpcfl through HPCFL_CMD. Checks launch lines, exit codes, the requeue rule and USR1 forwarding."""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "slurm"
TEMPLATES = ["single_node_gpu", "multi_node", "cpu_only", "requeue", "array_sweep"]
PLAIN = ["single_node_gpu", "multi_node", "cpu_only"]  # no logic of their own: exit code is srun's

# srun: record argv one per line, drop srun's own --options (the templates write them as
# --opt=value), then run the rest, as srun runs the program on each rank.
SRUN = r"""#!/bin/bash
printf '%s\n' "$@" > "$STANDIN_DIR/srun.argv"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
[ "${STANDIN_SRUN_RUN:-1}" = 1 ] || exit 0
exec "$@"
"""
SCONTROL = r"""#!/bin/bash
printf '%s\n' "$@" >> "$STANDIN_DIR/scontrol.argv"
exit "${STANDIN_SCONTROL_RC:-0}"
"""
# hpcfl: record argv; exit with STANDIN_EXIT, or (wait_usr1) wait for USR1, then exit 75 like the
# engine does after its checkpoint. Bounded: gives up with exit 1 after 10 s.
FAKE_HPCFL = r"""#!/bin/bash
printf '%s\n' "$@" > "$STANDIN_DIR/hpcfl.argv"
if [ "${STANDIN_MODE:-}" = wait_usr1 ]; then
    trap 'echo USR1 > "$STANDIN_DIR/got_usr1"; sleep "${STANDIN_STOP_DELAY:-0}"; exit 75' USR1
    touch "$STANDIN_DIR/ready"
    for _ in $(seq 200); do sleep 0.05; done
    exit 1
fi
exit "${STANDIN_EXIT:-0}"
"""


class Stand:
    """A tmp dir with the stand-ins; .run() a template in it and read back what was called."""

    def __init__(self, d: Path):
        self.dir = d
        bin_ = d / "bin"
        bin_.mkdir()
        for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
            (bin_ / name).write_text(text)
            (bin_ / name).chmod(0o755)
        self.hpcfl = d / "fake_hpcfl"
        self.hpcfl.write_text(FAKE_HPCFL)
        self.hpcfl.chmod(0o755)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "STANDIN_"))
               and k not in ("HPCFL_CMD", "MAX_REQUEUES")}
        env.update(PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}", STANDIN_DIR=str(d),
                   HPCFL_CMD=str(self.hpcfl), SLURM_JOB_ID="12345", SLURM_ARRAY_TASK_ID="3",
                   SLURM_NTASKS="4", SLURM_NNODES="1", SLURM_CPUS_PER_TASK="2")
        self.env = env

    def environ(self, **extra):
        env = dict(self.env)
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return env

    def run(self, template, **extra):
        path = template if isinstance(template, Path) else SLURM / f"{template}.sbatch"
        p = subprocess.run(["bash", str(path)], cwd=self.dir, env=self.environ(**extra),
                           capture_output=True, text=True, timeout=20)
        p.output = p.stdout + p.stderr
        return p

    def argv(self, name):
        f = self.dir / f"{name}.argv"
        return f.read_text().splitlines() if f.exists() else None

    def srun_split(self):
        """(srun's own options, the program's argv)."""
        argv = self.argv("srun")
        i = next(i for i, a in enumerate(argv) if not a.startswith("-"))
        return argv[:i], argv[i:]


@pytest.fixture
def stand(tmp_path):
    return Stand(tmp_path)


def directives(name):
    """#SBATCH options of a template as {option: value} (commented-out ##SBATCH lines skipped)."""
    out = {}
    for line in (SLURM / f"{name}.sbatch").read_text().splitlines():
        m = re.match(r"#SBATCH\s+(--[\w-]+)(?:=(\S+))?", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def set_pairs(argv):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]


def out_of(argv):
    return argv[argv.index("--out") + 1]


# ---- static checks ---------------------------------------------------------------------------

def test_all_templates_and_readme_exist():
    assert sorted(p.stem for p in SLURM.glob("*.sbatch")) == sorted(TEMPLATES)
    readme = (SLURM / "README.md").read_text()
    for name in TEMPLATES:
        assert f"{name}.sbatch" in readme
    for code in ("0", "2", "75"):
        assert re.search(rf"\b{code}\b", readme)


@pytest.mark.parametrize("name", TEMPLATES)
def test_bash_syntax(name):
    p = subprocess.run(["bash", "-n", str(SLURM / f"{name}.sbatch")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("name", TEMPLATES)
def test_directives_come_before_the_first_command(name):
    """sbatch stops reading #SBATCH lines at the first line that is not a comment or blank."""
    lines = (SLURM / f"{name}.sbatch").read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    first_cmd = next(i for i, s in enumerate(lines) if s.strip() and not s.lstrip().startswith("#"))
    assert not any(s.startswith("#SBATCH") for s in lines[first_cmd:])


@pytest.mark.parametrize("name", TEMPLATES)
def test_directives(name):
    d = directives(name)
    assert d.get("--cpus-per-task"), "every template sets --cpus-per-task"
    if "--gpus-per-node" in d:  # one rank per GPU
        assert d["--ntasks-per-node"] == d["--gpus-per-node"]
    if name == "requeue":
        assert re.fullmatch(r"B:USR1@\d+", d["--signal"])
        assert "--requeue" in d and d["--open-mode"] == "append"
    if name == "array_sweep":
        assert d["--array"] == "0-9"
    if name == "multi_node":
        assert int(d["--nodes"]) > 1


# ---- dry runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TEMPLATES)
def test_dry_run(stand, name):
    p = stand.run(name, STANDIN_EXIT=0)
    assert p.returncode == 0, p.output
    opts, prog = stand.srun_split()
    assert prog[:3] == [str(stand.hpcfl), "run", "jobs/quickstart.toml"]
    assert prog[1:] == stand.argv("hpcfl"), "srun ran the program with these arguments"
    assert out_of(prog).startswith("runs/")
    assert "--cpus-per-task=2" in opts
    assert "runtime.threads=2" in set_pairs(prog)
    assert stand.argv("scontrol") is None


@pytest.mark.parametrize("name", TEMPLATES)
def test_default_command_is_mpi4py_hpcfl(stand, name):
    p = stand.run(name, HPCFL_CMD=None, STANDIN_SRUN_RUN=0)
    assert p.returncode == 0, p.output
    _, prog = stand.srun_split()
    assert prog[:7] == ["python", "-m", "mpi4py", "-m", "hpcfl", "run", "jobs/quickstart.toml"]


def test_kill_on_bad_exit(stand):
    stand.run("multi_node")
    assert "--kill-on-bad-exit=1" in stand.srun_split()[0]
    stand.run("requeue")
    assert "--kill-on-bad-exit=0" in stand.srun_split()[0]


@pytest.mark.parametrize("name", PLAIN + ["array_sweep"])
@pytest.mark.parametrize("code", [0, 2, 75, 1])
def test_exit_code_is_the_programs(stand, name, code):
    p = stand.run(name, STANDIN_EXIT=code)
    assert p.returncode == code, p.output
    assert stand.argv("scontrol") is None


# ---- requeue ---------------------------------------------------------------------------------

def test_requeue_on_75(stand):
    p = stand.run("requeue", STANDIN_EXIT=75, SLURM_RESTART_COUNT=0)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert p.returncode == 75, p.output


def test_requeue_without_restart_count_counts_as_first_attempt(stand):
    p = stand.run("requeue", STANDIN_EXIT=75, SLURM_RESTART_COUNT=None)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert p.returncode == 75


def test_no_requeue_when_finished(stand):
    p = stand.run("requeue", STANDIN_EXIT=0, SLURM_RESTART_COUNT=0)
    assert p.returncode == 0, p.output
    assert stand.argv("scontrol") is None


@pytest.mark.parametrize("code", [2, 1, 137])
def test_no_requeue_on_bad_input_or_failure(stand, code):
    p = stand.run("requeue", STANDIN_EXIT=code, SLURM_RESTART_COUNT=0)
    assert p.returncode == code, p.output
    assert stand.argv("scontrol") is None


def test_cap_reached(stand):
    p = stand.run("requeue", STANDIN_EXIT=75, SLURM_RESTART_COUNT=5)
    assert p.returncode == 75
    assert stand.argv("scontrol") is None
    assert "NOT FINISHED after 5 requeue(s) (MAX_REQUEUES=5)" in p.output


def test_cap_from_environment(stand):
    p = stand.run("requeue", STANDIN_EXIT=75, SLURM_RESTART_COUNT=1, MAX_REQUEUES=2)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    (stand.dir / "scontrol.argv").unlink()
    p = stand.run("requeue", STANDIN_EXIT=75, SLURM_RESTART_COUNT=2, MAX_REQUEUES=2)
    assert p.returncode == 75 and stand.argv("scontrol") is None
    assert "MAX_REQUEUES=2" in p.output


def test_requeue_command_failing_is_reported(stand):
    p = stand.run("requeue", STANDIN_EXIT=75, STANDIN_SCONTROL_RC=1)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert p.returncode == 75
    assert "scontrol requeue failed" in p.output


@pytest.mark.parametrize("stop_delay", [0, 0.5])
def test_usr1_is_forwarded_and_the_job_requeued(stand, stop_delay):
    """sbatch --signal=B:USR1 signals only the batch shell: it must reach the program, and the
    75 that follows must requeue. stop_delay: the program takes a while to checkpoint."""
    env = stand.environ(STANDIN_MODE="wait_usr1", STANDIN_STOP_DELAY=stop_delay,
                        SLURM_RESTART_COUNT=0)
    proc = subprocess.Popen(["bash", str(SLURM / "requeue.sbatch")], cwd=stand.dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (stand.dir / "ready").exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "stand-in program never started"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGUSR1)  # the batch shell, as Slurm does with B:
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (stand.dir / "got_usr1").exists(), out
    assert proc.returncode == 75, out
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert "got USR1" in out


# ---- array -----------------------------------------------------------------------------------

def test_array_maps_task_id_to_seed_and_out(stand):
    p = stand.run("array_sweep", SLURM_ARRAY_TASK_ID=3)
    assert p.returncode == 0, p.output
    _, prog = stand.srun_split()
    assert "run.seed=3" in set_pairs(prog)
    assert out_of(prog) == "runs/sweep/seed-3"


def test_array_task_outside_values(stand):
    p = stand.run("array_sweep", SLURM_ARRAY_TASK_ID=10)
    assert p.returncode == 2
    assert stand.argv("srun") is None
    assert "--array=0-9" in p.output


def test_array_needs_a_task_id(stand):
    p = stand.run("array_sweep", SLURM_ARRAY_TASK_ID=None)
    assert p.returncode != 0 and stand.argv("srun") is None


def test_array_sweeps_a_bash_array(stand):
    """The documented edit: another KEY and a VALUES bash array."""
    text = (SLURM / "array_sweep.sbatch").read_text()
    text, n1 = re.subn(r"(?m)^KEY=\S+", "KEY=algorithm.lr", text)
    text, n2 = re.subn(r"(?m)^VALUES=\([^)]*\)", "VALUES=(0.01 0.03 0.1 0.3)", text)
    assert n1 == n2 == 1
    copy = stand.dir / "lr_sweep.sbatch"
    copy.write_text(text)
    p = stand.run(copy, SLURM_ARRAY_TASK_ID=2)
    assert p.returncode == 0, p.output
    _, prog = stand.srun_split()
    assert "algorithm.lr=0.1" in set_pairs(prog)
    assert out_of(prog) == "runs/sweep/lr-0.1"


def test_shellcheck_if_available():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed")
    p = subprocess.run(["shellcheck", "-s", "bash", *[str(SLURM / f"{n}.sbatch") for n in TEMPLATES]],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
