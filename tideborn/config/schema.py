"""The settings schema: one frozen dataclass per TOML section, composed in `Settings`.

Every field carries a one-line docstring (the string literal right after it); `docs/training.md`'s
settings reference is generated from those lines, and a test keeps it current. Validation lives in
`__post_init__` and raises `SettingError` naming the user-facing key; the loader adds where the value
came from. Derived values are properties, never mutation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tideborn.humanize import clipped

ACTIVATIONS = ("relu", "silu", "mish")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "step", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PROGRESS_STYLES = ("auto", "line", "plain", "off")
DATA_KINDS = ("auto", "synthetic", "hcpe", "psv", "hcpe3")
EVAL_SCALE_FITS = ("off", "per_file")
WEIGHT_DECAY_POLICIES = ("weights_only", "all")
DLSHOGI_EVAL_SCALE = 1 / 0.0013226
"""dlshogi's eval-to-win-rate scale, 756.0864962951762: `score_to_value` multiplies by 0.0013226."""
ENGINE_TYPES = ("dl",)
MODES = ("scratch", "finetune")
MAX_STEPS_LIMIT = 999_999_999
"""Checkpoints are named with a 9-digit step (`step-XXXXXXXXX.pt`)."""
SEED_LIMIT = 2**63 - 1
"""torch seeds its generators from a signed 64-bit integer."""
BLOCKS_LIMIT = 1_000
"""`model.blocks` at most: far past any shogi network, and a bound on the work of building one."""
WIDTH_LIMIT = 8_192
"""`model.channels` and `model.value_channels` at most (a 3x3 convolution of 8,192 channels is 2.4 GB)."""
VALUE_HIDDEN_LIMIT = 65_536
"""`model.value_hidden` at most."""


class SettingError(ValueError):
    """A setting holds a value it must not; `key` is the dotted name the user writes."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise SettingError(key, message)


def _one_of(value: str, choices: tuple[str, ...], key: str) -> None:
    _check(value in choices, key, f"must be one of {', '.join(choices)}; got {clipped(value)}")


@dataclass(frozen=True)
class RunSettings:
    type: str = "dl"
    """Engine family this run trains; only `dl` (the policy/value ResNet) is handled by this trainer."""
    network: str = ""
    """Architecture preset that sets `[model]` fields (e.g. `resnet10x192`); empty: `[model]` as given."""
    mode: str = "scratch"
    """`scratch` trains from random weights; `finetune` starts from `run.init_checkpoint`'s weights at step 0."""
    init_checkpoint: str = ""
    """Checkpoint whose weights a `finetune` run starts from (optimizer and step start fresh)."""

    def __post_init__(self) -> None:
        if self.type == "nnue":
            raise SettingError(
                "run.type",
                "'nnue' is not handled by this trainer: tideborn trains dl (policy/value ResNet) "
                "networks only; train NNUE with an NNUE trainer",
            )
        _one_of(self.type, ENGINE_TYPES, "run.type")
        _one_of(self.mode, MODES, "run.mode")
        if self.mode == "finetune":
            _check(bool(self.init_checkpoint), "run.init_checkpoint",
                   "must name a checkpoint when run.mode is 'finetune'")


@dataclass(frozen=True)
class PathSettings:
    data_root: str = "."
    """Directory that relative `data.train` / `data.test` paths resolve against."""
    runs_root: str = "runs"
    """Directory that a relative `runtime.out_dir` resolves against."""


@dataclass(frozen=True)
class ModelSettings:
    blocks: int = 10
    """Number of residual blocks in the tower (at most 1,000)."""
    channels: int = 192
    """Channels of every convolution in the tower (at most 8,192)."""
    activation: str = "relu"
    """Activation function: relu, silu or mish."""
    value_channels: int = 27
    """Channels of the value head's 1x1 convolution (at most 8,192)."""
    value_hidden: int = 256
    """Width of the value head's hidden fully connected layer (at most 65,536)."""

    def __post_init__(self) -> None:
        # Upper bounds too: a size from a typo or a crafted checkpoint must be refused here, not by the
        # allocator (model.channels=1000000 would ask for terabytes).
        for key, value, limit in (("model.blocks", self.blocks, BLOCKS_LIMIT),
                                  ("model.channels", self.channels, WIDTH_LIMIT),
                                  ("model.value_channels", self.value_channels, WIDTH_LIMIT),
                                  ("model.value_hidden", self.value_hidden, VALUE_HIDDEN_LIMIT)):
            _check(value >= 1, key, f"must be >= 1; got {value}")
            _check(value <= limit, key, f"must be <= {limit:,}; got {value}")
        _one_of(self.activation, ACTIVATIONS, "model.activation")


@dataclass(frozen=True)
class DataSettings:
    kind: str = "auto"
    """`synthetic` (random batches, for smoke runs), `hcpe`, `psv` or `hcpe3` teacher files, or `auto`: synthetic
    without `data.train`, else each file's kind from its extension (.hcpe; .bin/.psv; .hcpe3), kinds may be mixed."""
    train: tuple[str, ...] = ()
    """Training files or globs (teacher data kinds only)."""
    test: tuple[str, ...] = ()
    """Held-out files or globs for evaluation (teacher data kinds only)."""
    eval_scale: float = DLSHOGI_EVAL_SCALE
    """Evaluation (centipawn-like) units per logit in the value target's `sigmoid(eval / eval_scale)` (dlshogi's
    1 / 0.0013226 = 756.0865)."""
    eval_scale_fit: str = "off"
    """`per_file` fits the scale to each teacher file at start-up (dlshogi's evalfix: least squares of the result
    on `sigmoid(eval / a)`), logged in `run_started`; a file it cannot fit keeps `eval_scale`, with a warning."""
    bad_records: str = "skip"
    """A record whose move is empty or illegal: `skip` it (counted, reported in a `warning` event) or `error`."""
    workers: int = 2
    """Worker processes decoding teacher records into tensors (0 decodes in the training process)."""
    prefetch_batches: int = 4
    """Batches each worker prepares ahead of the training step."""
    eval_positions: int = 8192
    """At most this many `data.test` positions per evaluation."""
    policy_temperature: float = 1.0
    """hcpe3 policy target: the visit distribution p ∝ N^(1/T) (dlshogi's `--temperature`, default 1); 0: one-hot
    on the most visited move."""
    use_average: bool = False
    """Merge identical positions across all `data.train` files into one, averaging policy distributions, value
    and result (dlshogi's `--use_average`); the merged set is cached beside the first file."""
    watch: bool = False
    """Re-expand the `data.train` globs every `data.rescan_seconds` and at every checkpoint while training: complete
    new files join (docs/training.md, "Training inside a self-play loop"); one process only."""
    rescan_seconds: float = 60.0
    """With `data.watch`: seconds between rescans of the `data.train` globs."""
    window_positions: int = 0
    """Train on the newest this many positions, sampled uniformly (newest: by arrival order with `data.watch`, else
    the last of `data.train` in its order); 0: every position."""
    window_min_positions: int = 0
    """With `data.watch`: wait (state `waiting for data`) until the window holds at least this many positions."""

    def __post_init__(self) -> None:
        _one_of(self.kind, DATA_KINDS, "data.kind")
        _check(self.eval_scale > 0, "data.eval_scale", f"must be > 0; got {self.eval_scale}")
        _one_of(self.eval_scale_fit, EVAL_SCALE_FITS, "data.eval_scale_fit")
        _one_of(self.bad_records, ("skip", "error"), "data.bad_records")
        _check(self.workers >= 0, "data.workers", f"must be >= 0; got {self.workers}")
        _check(self.prefetch_batches >= 1, "data.prefetch_batches", f"must be >= 1; got {self.prefetch_batches}")
        _check(self.eval_positions >= 1, "data.eval_positions", f"must be >= 1; got {self.eval_positions}")
        _check(self.policy_temperature >= 0 and self.policy_temperature != float("inf"), "data.policy_temperature",
               f"must be a finite number >= 0; got {self.policy_temperature}")
        _check(self.resolved_kind != "unknown", "data.train",
               "cannot tell the format from the file extensions (.hcpe for hcpe; .bin or .psv for psv; .hcpe3 for "
               "hcpe3); set data.kind=\"hcpe\", \"psv\" or \"hcpe3\"")
        if self.kind in ("hcpe", "psv", "hcpe3"):
            _check(bool(self.train), "data.train", f"must list at least one file when data.kind is {self.kind!r}")
        _check(self.rescan_seconds > 0 and self.rescan_seconds != float("inf"), "data.rescan_seconds",
               f"must be a finite number > 0; got {self.rescan_seconds}")
        _check(self.window_positions >= 0, "data.window_positions", f"must be >= 0; got {self.window_positions}")
        _check(self.window_min_positions >= 0, "data.window_min_positions",
               f"must be >= 0; got {self.window_min_positions}")
        if self.watch:
            _check(bool(self.train) and self.kind != "synthetic", "data.watch",
                   "needs teacher data: data.train globs to watch (and data.kind not \"synthetic\")")
            _check(self.eval_scale_fit == "off", "data.watch",
                   "cannot be combined with data.eval_scale_fit = \"per_file\" (the scales are fitted once, at start)")

    @property
    def resolved_kind(self) -> str:
        """`synthetic`, `hcpe`, `psv`, `hcpe3`, or `mixed` (files of several kinds): what `auto` means for these
        files; `unknown` when an extension does not tell."""
        if self.kind != "auto":
            return self.kind
        if not self.train:
            return "synthetic"
        kinds = {_kind_from_extension(p) for p in (*self.train, *self.test)}
        if "unknown" in kinds:
            return "unknown"
        return kinds.pop() if len(kinds) == 1 else "mixed"


def _kind_from_extension(path: str) -> str:
    suffix = path.lower().rsplit(".", 1)[-1] if "." in path else ""
    return {"hcpe": "hcpe", "bin": "psv", "psv": "psv", "hcpe3": "hcpe3"}.get(suffix, "unknown")


@dataclass(frozen=True)
class OptimSettings:
    batch_size: int = 1024
    """Positions per optimizer step on each rank (split into `accumulation_steps` micro-batches)."""
    accumulation_steps: int = 1
    """Micro-batches per step; gradients are accumulated and applied once per step."""
    global_batch_size: int = 0
    """Positions per optimizer step over all processes, held constant whatever the world size (an elastic job that
    loses or gains nodes). When set, `batch_size / accumulation_steps` is the micro-batch (what one device holds)
    and the trainer derives each process's `batch_size` and `accumulation_steps` from it and the world size; a
    world size that cannot divide it into whole micro-batches is refused. 0: `batch_size` is per process, as is,
    and the global batch changes with the world size."""
    optimizer: str = "sgd"
    """Optimizer: `sgd` (momentum, optionally Nesterov) or `adamw`."""
    lr: float = 0.1
    """Peak learning rate, reached at the end of warm-up."""
    momentum: float = 0.9
    """SGD momentum."""
    nesterov: bool = True
    """Use Nesterov momentum with SGD."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's beta1 and beta2."""
    weight_decay: float = 1e-4
    """Decoupled (AdamW) or L2 (SGD) weight decay."""
    weight_decay_policy: str = "weights_only"
    """Which parameters `weight_decay` applies to: `weights_only` (convolution and linear weights) or `all`
    (BatchNorm parameters and biases too, as dlshogi does)."""
    policy_entropy_beta: float = 0.0
    """Entropy bonus: the loss is lowered by this times the mean policy entropy (dlshogi's `--beta`); 0: off."""
    grad_clip_norm: float = 0.0
    """Clip the gradients' global L2 norm to this value; 0 disables clipping (the norm is logged either way)."""
    schedule: str = "cosine"
    """Learning-rate decay after warm-up: `cosine` to `min_lr_ratio * lr` at max_steps, `step`, or `constant`."""
    warmup_steps: int = 0
    """Steps of linear warm-up from 0 to `lr`."""
    min_lr_ratio: float = 0.0
    """Cosine schedule's final learning rate as a fraction of `lr`."""
    decay_steps: tuple[int, ...] = ()
    """Step schedule: the steps at which the learning rate is multiplied by `decay_gamma`."""
    decay_gamma: float = 0.1
    """Step schedule: the factor applied at each of `decay_steps`."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the weights with this decay per step (e.g. 0.9999); 0 disables it."""

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "optim.batch_size", f"must be >= 1; got {self.batch_size}")
        _check(self.accumulation_steps >= 1, "optim.accumulation_steps",
               f"must be >= 1; got {self.accumulation_steps}")
        _check(self.batch_size % self.accumulation_steps == 0, "optim.accumulation_steps",
               f"must divide optim.batch_size ({self.batch_size}); got {self.accumulation_steps}")
        _check(self.global_batch_size >= 0, "optim.global_batch_size",
               f"must be >= 0 (0: off); got {self.global_batch_size}")
        _check(self.global_batch_size % self.micro_batch_size == 0, "optim.global_batch_size",
               f"must be a multiple of the micro-batch, optim.batch_size / optim.accumulation_steps "
               f"({self.micro_batch_size}); got {self.global_batch_size}")
        _one_of(self.optimizer, OPTIMIZERS, "optim.optimizer")
        _check(self.lr > 0, "optim.lr", f"must be > 0; got {self.lr}")
        _check(0 <= self.momentum < 1, "optim.momentum", f"must be in [0, 1); got {self.momentum}")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas",
               f"must be two numbers in [0, 1); got {list(self.betas)}")
        _check(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0; got {self.weight_decay}")
        _one_of(self.weight_decay_policy, WEIGHT_DECAY_POLICIES, "optim.weight_decay_policy")
        _check(self.policy_entropy_beta >= 0, "optim.policy_entropy_beta",
               f"must be >= 0; got {self.policy_entropy_beta}")
        _check(self.grad_clip_norm >= 0, "optim.grad_clip_norm", f"must be >= 0; got {self.grad_clip_norm}")
        _one_of(self.schedule, SCHEDULES, "optim.schedule")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0; got {self.warmup_steps}")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1]; got {self.min_lr_ratio}")
        _check(all(s >= 1 for s in self.decay_steps), "optim.decay_steps",
               f"must be steps >= 1; got {list(self.decay_steps)}")
        _check(list(self.decay_steps) == sorted(self.decay_steps), "optim.decay_steps",
               f"must be in increasing order; got {list(self.decay_steps)}")
        _check(0 < self.decay_gamma <= 1, "optim.decay_gamma", f"must be in (0, 1]; got {self.decay_gamma}")
        _check(0 <= self.ema_decay < 1, "optim.ema_decay", f"must be in [0, 1); got {self.ema_decay}")

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.accumulation_steps

    def split_among(self, world_size: int) -> OptimSettings:
        """These settings for one of `world_size` processes: with `global_batch_size`, the per-process batch and
        accumulation derived from it at the same micro-batch; without, unchanged. Raises SettingError when the
        world size cannot divide the global batch into whole micro-batches."""
        if not self.global_batch_size:
            return self
        micro = self.micro_batch_size
        _check(self.global_batch_size % (world_size * micro) == 0, "optim.global_batch_size",
               f"{self.global_batch_size} positions a step cannot be split among {world_size} process(es) in "
               f"micro-batches of {micro} (optim.batch_size / optim.accumulation_steps): use a world size that "
               f"divides {self.global_batch_size // micro}")
        accumulation = self.global_batch_size // (world_size * micro)
        return dataclasses.replace(self, batch_size=accumulation * micro, accumulation_steps=accumulation)


@dataclass(frozen=True)
class LossSettings:
    policy_weight: float = 1.0
    """Weight of the policy cross-entropy in the total loss."""
    value_weight: float = 1.0
    """Weight of the value binary cross-entropy in the total loss."""
    value_lambda: float = 0.333
    """Value target mix: `(1 - value_lambda) * result + value_lambda * sigmoid(eval / data.eval_scale)` (dlshogi's
    ~1/3)."""
    value_lambda_final: float = 0.0
    """With `value_lambda_decay_steps`: the mix weight reached at that step and kept after (dlshogi decays to 0)."""
    value_lambda_decay_steps: int = 0
    """Steps over which the mix weight goes linearly from `value_lambda` to `value_lambda_final` (dlshogi's
    `--val_lambda_decay_epoch`, by step); 0: no decay."""

    def __post_init__(self) -> None:
        _check(self.policy_weight >= 0, "loss.policy_weight", f"must be >= 0; got {self.policy_weight}")
        _check(self.value_weight >= 0, "loss.value_weight", f"must be >= 0; got {self.value_weight}")
        _check(0 <= self.value_lambda <= 1, "loss.value_lambda", f"must be in [0, 1]; got {self.value_lambda}")
        _check(0 <= self.value_lambda_final <= 1, "loss.value_lambda_final",
               f"must be in [0, 1]; got {self.value_lambda_final}")
        _check(self.value_lambda_decay_steps >= 0, "loss.value_lambda_decay_steps",
               f"must be >= 0 (0 = no decay); got {self.value_lambda_decay_steps}")
        _check(self.policy_weight + self.value_weight > 0, "loss.value_weight",
               "policy_weight and value_weight must not both be 0")


@dataclass(frozen=True)
class RuntimeSettings:
    max_steps: int = 1000
    """Train until this many optimizer steps have been taken (counting resumed ones)."""
    seed: int = 0
    """Seed for weight initialisation and the data order; the same seed gives the same run."""
    device: str = "auto"
    """`auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`."""
    precision: str = "auto"
    """Autocast precision: `auto` (bf16 on a GPU with native bf16, Ampere or newer; fp16 with a grad scaler on
    Volta and Turing, where bf16 is only emulated; fp32 on older GPUs and the CPU), `fp32`, `bf16`, or `fp16`
    (with a grad scaler)."""
    tf32: bool = True
    """Allow TF32 matrix multiplies and convolutions on CUDA."""
    channels_last: bool = True
    """Use the channels_last memory format for the network and its inputs (faster convolutions: tensor cores on
    CUDA, oneDNN on the CPU)."""
    compile: bool = False
    """Compile the model with `torch.compile` (slower start, faster steps)."""
    compile_mode: str = "default"
    """`torch.compile`'s mode with `runtime.compile`: `default`, `reduce-overhead` (the step's forward and
    backward replayed as CUDA graphs, which takes the launch cost off the host: a small net's step on a fast
    GPU is bound by it; scripts/gpu-check.sh measures it), `max-autotune` or `max-autotune-no-cudagraphs`."""
    fused_optimizer: bool = True
    """Use the fused (single-kernel) optimizer step on CUDA; ignored on the CPU."""
    deterministic: bool = False
    """Deterministic CUDA kernels (cuDNN without autotuning, `torch.use_deterministic_algorithms`): two runs, or a
    run and its resume, then match bit for bit on a GPU, at some speed (scripts/gpu-check.sh measures it). The
    CPU is deterministic without it."""
    pin_memory: bool = True
    """Teacher batches reach CUDA from pinned host memory by asynchronous copies that overlap the step; off:
    pageable memory and blocking copies. Ignored on the CPU and for synthetic data (made on the device)."""
    threads: int = 0
    """CPU threads for torch (`torch.set_num_threads`); 0 chooses them on the CPU from the free cores and
    `data.workers` (docs/training.md, CPU threads), and keeps torch's default on CUDA or when
    `OMP_NUM_THREADS` is set."""
    out_dir: str = "ckpt/default"
    """Run directory for events and checkpoints; relative paths resolve against `paths.runs_root`."""
    log_every: int = 10
    """Write a `step` event (and a progress line) every this many steps."""
    checkpoint_every: int = 1000
    """Write a checkpoint every this many steps (and always at the end)."""
    eval_every: int = 1000
    """Evaluate on `data.test` every this many steps (and at the end); teacher data with test files only."""
    match_every: int = 0
    """Every this many steps (a multiple of checkpoint_every), play the checkpoint just saved against
    runtime.match_reference and write a `match` event with its Elo (docs/match.md); 0 turns it off."""
    match_reference: str = ""
    """The checkpoint matches are played against; empty: the run's first checkpoint (kept, hard-linked, as
    RUN_DIR/match-reference.pt so that pruning does not remove it; if it is lost, restored from its step file,
    or else a `warning` says the Elo origin moved)."""
    match_games: int = 40
    """Games of each match during a run (each opening twice, colours swapped; on the training device)."""
    gpu_event_seconds: float = 10.0
    """On CUDA, write a `gpu` event (utilisation, memory, temperature, power) this often."""
    keep_checkpoints: int = 5
    """How many of the newest step checkpoints to keep; older ones are deleted after a new one is written."""
    progress: str = "auto"
    """Terminal progress: `auto` (updating line on a terminal, else `plain`), `line`, `plain` (a line per log),
    `off`."""
    dist_timeout_seconds: float = 600.0
    """Under torchrun: how long a collective may wait for the other ranks before the run fails."""
    ddp_diagnostics: bool = False
    """Under torchrun: count gradient all-reduces and check after every step that all ranks hold identical
    parameters."""
    export_onnx: bool = False
    """At the end of a run, export the final weights (EMA when kept) to `RUN_DIR/step-XXXXXXXXX.onnx`,
    parity-checked."""
    export_every: int = 0
    """Every this many steps, and at the step the run finishes, export the weights for the engine (EMA when kept)
    to `RUN_DIR/export/step-XXXXXXXXX.onnx`, parity-checked, then replace `RUN_DIR/export/latest.onnx` with it by a
    rename (never half-written); any multiple, not only of checkpoint_every (it takes the weights in memory).
    A failed export is a `warning` and training goes on. 0 turns it off."""
    export_keep: int = 5
    """How many of the newest `export/step-*.onnx` to keep; older ones are deleted after a new one is published
    (never the one `latest.onnx` is)."""
    stop_on_nonfinite: bool = True
    """Stop the run with `run_failed` when a logged loss is NaN or infinite (the last checkpoint stays good)."""

    def __post_init__(self) -> None:
        _check(self.max_steps >= 1, "runtime.max_steps", f"must be >= 1; got {self.max_steps}")
        _check(self.max_steps <= MAX_STEPS_LIMIT, "runtime.max_steps",
               f"must be <= {MAX_STEPS_LIMIT:,} (checkpoint names have 9 digits); got {self.max_steps}")
        _check(self.seed >= 0, "runtime.seed", f"must be >= 0; got {self.seed}")
        _check(self.seed <= SEED_LIMIT, "runtime.seed", f"must be <= {SEED_LIMIT} (a 64-bit seed); got {self.seed}")
        _check(self.device in ("auto", "cpu", "cuda") or (self.device.startswith("cuda:")
                                                           and self.device[5:].isdigit()),
               "runtime.device", f"must be auto, cpu, cuda or cuda:N; got {clipped(self.device)}")
        _one_of(self.precision, PRECISIONS, "runtime.precision")
        _one_of(self.compile_mode, COMPILE_MODES, "runtime.compile_mode")
        _check(self.threads >= 0, "runtime.threads", f"must be >= 0; got {self.threads}")
        _check(bool(self.out_dir), "runtime.out_dir", "must not be empty")
        _check(self.log_every >= 1, "runtime.log_every", f"must be >= 1; got {self.log_every}")
        _check(self.eval_every >= 1, "runtime.eval_every", f"must be >= 1; got {self.eval_every}")
        _check(self.match_every >= 0, "runtime.match_every", f"must be >= 0 (0 = off); got {self.match_every}")
        _check(self.match_every % max(self.checkpoint_every, 1) == 0, "runtime.match_every",
               f"must be a multiple of runtime.checkpoint_every ({self.checkpoint_every}): a match plays the "
               f"checkpoint just saved; got {self.match_every}")
        _check(self.export_every >= 0, "runtime.export_every", f"must be >= 0 (0 = off); got {self.export_every}")
        _check(self.export_keep >= 1, "runtime.export_keep",
               f"must be >= 1 (latest.onnx is a second name of the newest); got {self.export_keep}")
        _check(2 <= self.match_games <= 10_000, "runtime.match_games",
               f"must be between 2 and 10,000; got {self.match_games}")
        _check(self.checkpoint_every >= 1, "runtime.checkpoint_every",
               f"must be >= 1; got {self.checkpoint_every}")
        _check(self.gpu_event_seconds > 0, "runtime.gpu_event_seconds",
               f"must be > 0; got {self.gpu_event_seconds}")
        _check(self.keep_checkpoints >= 1, "runtime.keep_checkpoints",
               f"must be >= 1; got {self.keep_checkpoints}")
        _one_of(self.progress, PROGRESS_STYLES, "runtime.progress")
        _check(self.dist_timeout_seconds > 0, "runtime.dist_timeout_seconds",
               f"must be > 0; got {self.dist_timeout_seconds}")


@dataclass(frozen=True)
class WatchdogSettings:
    enabled: bool = True
    """Halt the run (`run_failed`, no checkpoint of the broken weights) when the gradient norm is non-finite or
    stays far above its running median (docs/training.md, Gradient watchdog)."""
    window: int = 100
    """Steps whose gradient norms make the running median."""
    factor: float = 10.0
    """A step's gradient norm above this many times the running median counts as a spike."""
    consecutive: int = 3
    """Spikes in a row that halt the run (one spike is only a bad batch)."""
    warmup_steps: int = 10
    """Norms a fresh run gathers before it judges spikes; until `window` fills, the median is that of its first
    norms. A resumed run is judged from its first step: the checkpoint holds the history."""

    def __post_init__(self) -> None:
        _check(self.window >= 1, "watchdog.window", f"must be >= 1; got {self.window}")
        _check(self.factor > 1, "watchdog.factor", f"must be > 1; got {self.factor}")
        _check(self.consecutive >= 1, "watchdog.consecutive", f"must be >= 1; got {self.consecutive}")
        _check(self.warmup_steps >= 1, "watchdog.warmup_steps", f"must be >= 1; got {self.warmup_steps}")


@dataclass(frozen=True)
class Settings:
    run: RunSettings = field(default_factory=RunSettings)
    """What is trained and from where: engine family, network preset, mode."""
    paths: PathSettings = field(default_factory=PathSettings)
    """Project-level roots, usually set in `tideborn.toml`."""
    model: ModelSettings = field(default_factory=ModelSettings)
    """The policy/value ResNet's shape."""
    data: DataSettings = field(default_factory=DataSettings)
    """Where training positions come from."""
    optim: OptimSettings = field(default_factory=OptimSettings)
    """Batch, optimizer and learning-rate schedule."""
    loss: LossSettings = field(default_factory=LossSettings)
    """How the policy and value losses combine."""
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    """Length, device, precision, logging and checkpoint cadence."""
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    """The gradient watchdog: halts a run whose gradient norm explodes, before its weights are saved."""

    def __post_init__(self) -> None:
        for step in self.optim.decay_steps:
            _check(step <= self.runtime.max_steps, "optim.decay_steps",
                   f"step {step} is past runtime.max_steps ({self.runtime.max_steps})")

    def to_dict(self) -> dict:
        """Plain data (dicts, lists, str, int, float, bool): JSON, TOML and `torch.load(weights_only=True)` safe."""
        return _plain(dataclasses.asdict(self))


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Settings)}  # type: ignore[misc]

# Settings a checkpoint cannot be resumed under when they differ: they change the network (its
# parameter shapes or its function), the optimizer's state layout, or what the data cursor counts.
RESUME_FIXED_KEYS = (
    "model.blocks", "model.channels", "model.value_channels", "model.value_hidden", "model.activation",
    "optim.optimizer", "data.kind", "run.type",
)
