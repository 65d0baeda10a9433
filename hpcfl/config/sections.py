"""The job's sections as frozen dataclasses: ``[run] [data] [model] [algorithm] [runtime]
[checkpoint] [guard] [watchdog] [results]``.

Each field's metadata carries its constraints (see :mod:`hpcfl.config.options`) and a one-line
``help`` that ``hpcfl config`` prints. Components chosen by name (datasets, partitions,
models, policies) declare their own option classes beside their code.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from ..algorithms import registry
from ..algorithms.sampling import STATIC_WEIGHTS, canonical

LOCAL_SOLVERS = tuple(registry.LOCAL)
STEPS_POLICIES = tuple(registry.STEPS)
WEIGHTS_POLICIES = tuple(registry.WEIGHTS)
SERVER_RULES = tuple(registry.SERVER)
STATEFUL_LOCAL = ("scaffold", "vr", "dyn")   # local add-ons with per-client state
# with_replacement_draws: the per-draw scheme's name until issue 14, now an alias of with_replacement
SAMPLING = ("uniform", "with_replacement", "with_replacement_merged", "with_replacement_draws", "unbiased")
PROX_LOCAL = ("prox", "scaffold", "vr")   # locals whose solver takes mu (x - x0): prox alone, or with a correction
PRESETS = registry.PRESETS   # paper algorithms as presets over the four slots (docs/algorithms/)
POLICY_SLOTS = ("local", "steps", "weights", "server")


DEFAULT_CLIENT_SAMPLE = 0.01   # results.client_sample left out: a panel of 1 % of the clients

RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class RunSection:
    name: str = field(default="run", metadata={
        "help": "run name; the default output folder is runs/<name> (letters, digits, '.', '_', '-')"})
    seed: int = field(default=0, metadata={
        "ge": 0, "help": "root seed: every random draw is a pure function of (seed, round, client)"})
    rounds: int = field(default=10, metadata={"gt": 0, "help": "number of communication rounds"})
    eval_every: int = field(default=1, metadata={
        "ge": 0, "help": "evaluate on the test set every this many rounds and after the last; 0: after the last "
                         "round only"})
    eval_train: bool = field(default=False, metadata={
        "help": "also evaluate the global model on all clients' training samples, F(x) = sum p_i F_i(x)"})
    eval_clients: bool = field(default=True, metadata={
        "help": "at each evaluation, also each client's accuracy and loss on its own held-out test rows (drawn from "
                "the test set with its label mix, keyed by seed and client: docs/results.md); classifiers only; "
                "the test set's forward pass is shared, so it costs little (docs/performance.md)"})
    eval_clients_min: int = field(default=10, metadata={
        "ge": 1, "help": "least held-out test rows per client for eval_clients (a client's share of the test set, "
                         "in proportion to its training samples, when that is more)"})

    def validate(self) -> list[str]:
        # runs/<name> must stay inside runs/ and be one plain folder name
        if not RUN_NAME.fullmatch(self.name) or self.name in (".", ".."):
            return [f"run.name = {self.name!r} must be a plain name of letters, digits, '.', '_' and '-' "
                    f"(no '/', no '..', no spaces), e.g. run.name = \"dirichlet_a0.5_seed1\""]
        return []


@dataclass(frozen=True)
class DataSection:
    dataset: str = field(default="digits", metadata={"help": "dataset name; its options go in [data.<dataset>]"})
    root: str | None = field(default=None, metadata={
        "help": "folder with the files of an on-disk dataset (cifar10, cifar100, mnist, fashion_mnist, emnist, npz, "
                "leaf, tff, speech_commands); unset: none (embedded datasets)"})
    partition: str = field(default="iid", metadata={
        "help": "how the training set is split over the clients; its options go in [data.<partition>]"})
    num_clients: int = field(default=10, metadata={"gt": 0, "help": "number of simulated clients K"})
    cache: str = field(default="auto", metadata={
        "help": "where generated datasets (synthetic, synthetic_images, gaussian_mixture, lga_synthetic) are kept "
                "between runs, keyed by their options and seed: auto ($HPCFL_CACHE_DIR, else ~/.cache/hpcfl), off, "
                "or a folder"})


@dataclass(frozen=True)
class ModelSection:
    name: str = field(default="mlp", metadata={"help": "model architecture; its options go in [model.<name>]"})


@dataclass(frozen=True)
class AlgorithmSection:
    name: str = field(default="fedavg", metadata={
        "choices": tuple(PRESETS),
        "help": "algorithm preset: fills the policy slots local, steps, weights, server not set here (custom fills "
                "none)"})
    local: str | None = field(default=None, metadata={
        "choices": LOCAL_SOLVERS, "help": "local solver slot: sgd, prox (FedProx, needs mu), scaffold, vr (FedNova "
                                          "variance reduction), dyn (FedDyn); unset: the preset's, else sgd"})
    steps: str | None = field(default=None, metadata={
        "choices": STEPS_POLICIES,
        "help": "local steps slot: epochs, fixed (local_steps), random_epochs, client_steps, gsnr, straggler "
                "(slow clients run fewer epochs), gift, adacomm, afl (one tau for all, adapted between rounds from "
                "tau0 = local_steps); unset: the preset's, else fixed when local_steps > 0, else epochs"})
    weights: str | None = field(default=None, metadata={
        "choices": WEIGHTS_POLICIES,
        "help": "aggregation weights slot: size (n_i), uniform, disco (FedDisco); unset: the preset's, else size"})
    server: str | None = field(default=None, metadata={
        "choices": SERVER_RULES, "help": "server rule slot: average, nova (FedNova), lga (FedLGA), dyn (FedDyn); "
                                         "unset: the preset's, else average"})
    clients_per_round: int = field(default=0, metadata={
        "ge": 0, "help": "clients sampled per round; 0: all clients every round"})
    sampling: str = field(default="uniform", metadata={
        "choices": SAMPLING, "help": "cohort draw: uniform = without replacement; with_replacement (each draw trains "
                                     "on its own, weight 1/q; with_replacement_draws is an alias), "
                                     "with_replacement_merged (a repeated client trains once, weight k/q) and unbiased "
                                     "need clients_per_round > 0 and weights = size or uniform"})
    lr: float = field(default=0.05, metadata={
        "gt": 0, "help": "client learning rate of the local SGD steps (before any lr schedule)"})
    momentum: float = field(default=0.0, metadata={
        "ge": 0, "lt": 1, "help": "client SGD momentum, restarted every round; 0: none"})
    weight_decay: float = field(default=0.0, metadata={
        "ge": 0, "help": "L2 weight decay added to the local objective; 0: none"})
    mu: float = field(default=0.0, metadata={
        "ge": 0, "help": "proximal weight mu (FedProx): left out with local = 'prox' it is 0.01 (the FedDisco and "
                         "FedGSNR papers' FedProx); optional with scaffold and vr, refused with the other locals"})
    batch_size: int = field(default=32, metadata={"gt": 0, "help": "local mini-batch size B, in samples"})
    local_epochs: int = field(default=1, metadata={
        "gt": 0, "help": "local epochs E per round, for steps = 'epochs' and 'straggler' (unit = 'epoch')"})
    epoch_rounding: str = field(default="ceil", metadata={
        "choices": ("ceil", "floor"),
        "help": "steps of E epochs on n_i samples: ceil = E*ceil(n_i/B), floor = floor(E*n_i/B) (the FedNova paper)"})
    local_steps: int = field(default=0, metadata={
        "ge": 0, "help": "local steps K per round for steps = 'fixed' (E for steps = 'straggler' with unit = "
                         "'step'; the budget E_const for 'gsnr' and tau0 for 'gift', 'adacomm', 'afl', which with "
                         "0 start from local_epochs' worth: round(mean_i E * ceil(n_i / B))); 0: not used"})
    server_lr: float = field(default=1.0, metadata={
        "gt": 0, "help": "server learning rate: x <- x + server_lr * aggregated update (1: plain averaging)"})
    server_momentum: float = field(default=0.0, metadata={
        "ge": 0, "lt": 1, "help": "server momentum beta (FedAvgM; lr-scaled as in FedNova with server = 'nova'); 0: "
                                  "none"})
    lr_schedule: str = field(default="constant", metadata={
        "choices": ("constant", "step"),
        "help": "client lr over rounds: constant, or step (times lr_gamma after each milestone)"})
    lr_milestones: tuple[float, ...] = field(default=(0.5, 0.75), metadata={
        "gt": 0, "lt": 1, "help": "step-schedule milestones as fractions of run.rounds: the lr drops after int(f * "
                                  "rounds) rounds"})
    lr_milestone_rounds: tuple[int, ...] | None = field(default=None, metadata={
        "ge": 1, "help": "step-schedule milestones in rounds (m: the lr drops from round m+1 on); unset: use "
                         "lr_milestones"})
    lr_gamma: float = field(default=0.1, metadata={
        "gt": 0, "le": 1, "help": "factor applied to the lr at each milestone of the step schedule"})
    local_lr_decay: float = field(default=1.0, metadata={
        "gt": 0, "le": 1, "help": "within a round, local step k uses lr * local_lr_decay**k (FedNova, Sec. 4.1); 1: "
                                  "no decay"})

    def validate(self) -> list[str]:
        p = []
        if self.lr_milestone_rounds is not None:
            if self.lr_schedule != "step":
                p.append("algorithm.lr_milestone_rounds is used only with algorithm.lr_schedule = 'step'")
            if list(self.lr_milestone_rounds) != sorted(set(self.lr_milestone_rounds)):
                p.append(f"algorithm.lr_milestone_rounds = {list(self.lr_milestone_rounds)} must be increasing")
        if self.local == "vr" and (self.clients_per_round != 0 or self.sampling != "uniform"):
            p.append("algorithm.local = 'vr' (FedNova variance reduction) needs full participation: "
                     "set algorithm.clients_per_round = 0")
        if self.sampling != "uniform" and self.clients_per_round == 0:
            p.append(f"algorithm.sampling = {self.sampling!r} needs partial participation; set "
                     f"algorithm.clients_per_round")
        if canonical(self.sampling) == "with_replacement" and (self.local in STATEFUL_LOCAL or self.steps == "gsnr"):
            what = f"local = {self.local!r}" if self.local in STATEFUL_LOCAL else "steps = 'gsnr'"
            p.append(f"algorithm.sampling = {self.sampling!r} trains a client drawn twice as two instances, "
                     f"which per-client state or statistics ({what}) cannot follow; use sampling = "
                     f"'with_replacement_merged' (a repeated client trains once, weight k/q) or 'uniform'")
        if (self.local == "dyn") != (self.server == "dyn"):
            p.append(f"FedDyn needs both algorithm.local = 'dyn' and algorithm.server = 'dyn' (got local = "
                     f"{self.local!r}, server = {self.server!r}); or use algorithm.name = 'feddyn'")
        if self.local == "prox" and self.mu == 0:
            p.append("algorithm.local = 'prox' needs algorithm.mu > 0, FedProx's proximal weight (e.g. mu = 0.01, "
                     "the FedDisco and FedGSNR papers' choice; left out, it is 0.01)")
        if self.local not in PROX_LOCAL and self.mu > 0:
            # sgd with mu would be FedProx under another name; FedDyn's alpha already is its proximal weight
            p.append(f"algorithm.mu = {self.mu} is used only by local = 'prox', 'scaffold' or 'vr', not local = "
                     f"{self.local!r}; set algorithm.local = 'prox' (FedProx) or algorithm.mu = 0")
        if self.steps == "fixed" and self.local_steps == 0:
            p.append("algorithm.steps = 'fixed' needs algorithm.local_steps > 0")
        if self.steps == "epochs" and self.local_steps > 0:
            p.append("algorithm.local_steps is set but algorithm.steps = 'epochs'; drop one of them")
        if self.sampling != "uniform" and self.weights not in STATIC_WEIGHTS:
            p.append(f"algorithm.sampling = {self.sampling!r} weights each draw by the sampling itself and is "
                     f"defined for weights = 'size' or 'uniform' only, not {self.weights!r} (weights computed "
                     f"over each round's sampled set); use algorithm.sampling = 'uniform'")
        return p


@dataclass(frozen=True)
class RuntimeSection:
    reduce: str = field(default="exact", metadata={
        "choices": ("exact", "float"),
        "help": "exact: fixed-point sum, bitwise the same on any number of ranks; float: plain Allreduce, faster, "
                "not reproducible across rank counts"})
    device: str = field(default="auto", metadata={
        "choices": ("auto", "cpu", "cuda"),
        "help": "auto: one GPU per rank when CUDA is available (the node's ranks take GPUs in node-local rank "
                "order, each the least used one it sees), else the CPU; cuda: the same, and exit 2 without CUDA"})
    share_gpus: bool = field(default=False, metadata={
        "help": "let ranks of a node share GPUs when they outnumber them (least used first); false: more ranks "
                "than GPUs on a node is refused (exit 2). Results are the same either way"})
    deterministic: bool = field(default=True, metadata={
        "help": "bitwise reproducible on a GPU: torch's deterministic algorithms, cuDNN's deterministic "
                "(not benchmarked) kernels and CUBLAS_WORKSPACE_CONFIG=:4096:8, set before CUDA starts; an "
                "operation without a deterministic CUDA kernel stops the run (exit 2). false: faster on a GPU, "
                "but results differ from run to run (README, Reproducibility); no effect on CPU results"})
    threads: int = field(default=0, metadata={
        "ge": 0, "help": "torch threads per rank; 0: 1 for a model under 1M parameters (a second thread gains at "
                         "most a quarter there on idle cores and costs 7-33x on busy ones), else cores on the node "
                         "/ ranks on the node"})
    dtype: str = field(default="float32", metadata={
        "choices": ("float32", "float64"),
        "help": "floating-point precision of the model, the data and training"})
    placement: str = field(default="balanced", metadata={
        "choices": ("balanced", "block", "round_robin"),
        "help": "clients to ranks: balanced (each round's cohort dealt to ranks by expected work, longest first; "
                "per-client state travels with the client; algorithms with a statistics phase or held clients "
                "train them on their home block), "
                "block (contiguous) or round_robin (client i on rank i mod R); results do not depend on it"})
    vectorize: str = field(default="auto", metadata={
        "choices": ("auto", "off", "on"),
        "help": "auto: batched groups for models with a closed-form batched gradient (quadratic, logreg) and, on a "
                "GPU, for every model that vmaps (LeNet-5, VGG without batch norm, MLPs), else one client at a "
                "time; on: train a rank's clients in batched groups (one forward/backward for many "
                "clients; pays for tiny models such as the quadratic, logreg and small MLPs); results equal the sequential loop's "
                "within float rounding and, on the CPU, are bitwise the same on any number of ranks; batched torch "
                "groups are min(64, clients trained in the round) rows on every rank, padded, so that a client's "
                "kernels see the same shapes on any number of ranks (a small cohort gains no speed from more ranks); models it cannot take "
                "(batch norm, dropout, augmentation) are refused with the reason"})
    lanes: int = field(default=0, metadata={
        "ge": 0, "help": "clients trained at once on a rank's CPU, each on one torch thread of runtime.threads "
                         "(docs/performance.md, 'Clients on CPU threads'); 0: as many as the rank's threads "
                         "for the zoo's convolutional or recurrent models under 1M parameters and dense ones "
                         "of 100k-1M, trained one client at a time, else 1; 1: one client at a time "
                         "with every thread in each operation. Each client's result is the same bits at any "
                         "lane count; models with dropout are refused"})
    step: str = field(default="auto", metadata={
        "choices": ("auto", "autograd"),
        "help": "auto: a zoo model that is a plain chain of layers (LeNet-5, MLPs) takes its CPU step without "
                "autograd, through the same kernels (bitwise the same gradients, checked at start-up); autograd: "
                "always torch.autograd"})
    eval_batch_size: int = field(default=1000, metadata={
        "gt": 0, "help": "samples per evaluation chunk (chunks are dealt to the ranks round-robin)"})
    progress: str = field(default="auto", metadata={
        "choices": ("auto", "bar", "line", "none"),
        "help": "per-round output: auto (a bar on a terminal, else one line per round), bar, line, none"})


@dataclass(frozen=True)
class CheckpointSection:
    every: int = field(default=0, metadata={
        "ge": 0, "help": "checkpoint every this many rounds; 0: off (a stop and the end of the run always "
                         "checkpoint)"})
    every_minutes: float = field(default=10.0, metadata={
        "ge": 0, "help": "also checkpoint at the first round end after this many wall-clock minutes; 0: off"})
    keep: int = field(default=3, metadata={
        "ge": 2, "help": "newest valid checkpoints kept (at least 2: a damaged newest one has a fallback)"})
    dir: str | None = field(default=None, metadata={
        "help": "checkpoint folder, owned by one run; unset: <out>/checkpoints"})
    shards: bool = field(default=True, metadata={
        "help": "on several ranks, every rank writes its own clients' rows (a shard file each, in parallel) and "
                "rank 0 a manifest last; the folder must be one every node reaches. false: every row goes "
                "through rank 0 into one file. Either kind resumes on any rank count"})


@dataclass(frozen=True)
class GuardSection:
    policy: str = field(default="stop", metadata={
        "choices": ("stop", "skip"),
        "help": "a client update with NaN/Inf or a norm above max_norm: stop = end the run (exit 3), skip = leave it "
                "out of the round and record it"})
    max_norm: float = field(default=0.0, metadata={
        "ge": 0, "help": "bound on the L2 norm of one client's update; 0: no bound (NaN/Inf are always refused)"})


@dataclass(frozen=True)
class WatchdogSection:
    timeout_s: float | None = field(default=None, metadata={
        "ge": 0, "help": "end the job (exit 75, resumable) when one phase of one round runs longer than this many "
                         "seconds; 0: off; unset: a limit derived from the run's own round times (floor_s, factor, "
                         "startup_s), on a job of several ranks"})
    floor_s: float = field(default=60.0, metadata={
        "gt": 0, "help": "derived limit: never less than this many seconds (a healthy phase of a quick job on a "
                         "loaded machine stays far below; a frozen rank is found this long after it stopped)"})
    factor: float = field(default=10.0, metadata={
        "ge": 1, "help": "derived limit: this many times the slowest round so far, or this rank's own time in the "
                         "round before the phase, whichever is longer"})
    startup_s: float = field(default=600.0, metadata={
        "gt": 0, "help": "derived limit: at least this many seconds before a first round has finished in this "
                         "process, and in a first evaluation or checkpoint (compilation, first writes; a checkpoint "
                         "also gets its state's size at 20 MB/s)"})


@dataclass(frozen=True)
class ResultsSection:
    locking: bool = field(default=True, metadata={
        "help": "HDF5 file locking; false on filesystems without it (sets HDF5_USE_FILE_LOCKING=FALSE)"})
    flush_seconds: float = field(default=2.0, metadata={"ge": 0, "help":
        "rank 0 buffers rounds and writes them to results.h5 at most this many seconds apart (and before "
        "every checkpoint), off the rounds' critical path; 0 writes every round"})
    clients: str = field(default="all", metadata={
        "choices": ("all", "sampled", "none"), "help": "per-client rows in results.h5 (/clients): all (one row "
                                                       "per cohort member and round), sampled (the rows of a fixed "
                                                       "panel of clients only, results.client_sample) or none "
                                                       "(metrics only; a 100k-client cohort writes ~0.9 MB a round "
                                                       "of rows, docs/results.md); kept on resume"})
    client_sample: float | None = field(default=None, metadata={
        "help": "results.clients = 'sampled': the fraction in (0, 1] of all clients in the panel, ceil(fraction * "
                "num_clients) clients drawn once from run.seed; unset: 0.01 (1 %); kept on resume"})

    def validate(self) -> list[str]:
        f = self.client_sample
        if f is None:
            return []
        if not 0 < f <= 1:
            return [f"results.client_sample = {f!r} must be a fraction of the clients in (0, 1], e.g. "
                    f"results.client_sample = 0.01 for a panel of 1 % of them"]
        if self.clients != "sampled":
            return [f"results.client_sample = {f!r} is used only with results.clients = 'sampled' (this job has "
                    f"{self.clients!r}); set results.clients = 'sampled' or leave results.client_sample out"]
        return []

    @property
    def sample_fraction(self) -> float:
        """The panel's fraction of the clients: ``client_sample``, or :data:`DEFAULT_CLIENT_SAMPLE` unset."""
        return DEFAULT_CLIENT_SAMPLE if self.client_sample is None else self.client_sample


def defaults() -> dict:
    """Section defaults as a nested dict (sections only; components have their own tables)."""
    return {name: dataclasses.asdict(cls()) for name, cls in
            (("run", RunSection), ("algorithm", AlgorithmSection), ("runtime", RuntimeSection),
             ("checkpoint", CheckpointSection), ("guard", GuardSection), ("watchdog", WatchdogSection),
             ("results", ResultsSection))}
