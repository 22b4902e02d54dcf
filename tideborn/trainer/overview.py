"""The text `summary` prints: the network, then the data, optimizer and runtime settings train would use."""

from __future__ import annotations

import torch

from tideborn.config.load import Resolved
from tideborn.config.schema import RuntimeSettings
from tideborn.errors import UserError
from tideborn.network.model import build_model
from tideborn.rundir.layout import latest_checkpoint, run_dir_of
from tideborn.trainer.device import resolve_device
from tideborn.trainer.preflight import check_start_step, check_teacher_data
from tideborn.trainer.summary import format_model_summary, parameter_bytes, summarize_model


def _optimizer_line(optim) -> str:
    if optim.optimizer == "sgd":
        kind = f"sgd (momentum {optim.momentum}{', nesterov' if optim.nesterov else ''})"
    else:
        kind = f"adamw (betas {optim.betas[0]}, {optim.betas[1]})"
    schedule = {"cosine": f"cosine to {optim.min_lr_ratio:g} x lr",
                "step": f"step x{optim.decay_gamma:g} at {list(optim.decay_steps)}",
                "constant": "constant"}[optim.schedule]
    clip = f"clip grad norm at {optim.grad_clip_norm:g}" if optim.grad_clip_norm else "no clipping"
    decayed = "every parameter" if optim.weight_decay_policy == "all" else "weights only"
    return (f"{kind}, lr {optim.lr:g}, weight decay {optim.weight_decay:g} ({decayed}), "
            f"warm-up {optim.warmup_steps} steps then {schedule}, {clip}")


def _loss_line(s) -> str:
    loss = s.loss
    text = f"{loss.policy_weight:g} x policy cross-entropy + {loss.value_weight:g} x value BCE"
    if s.optim.policy_entropy_beta:
        text += f" - {s.optim.policy_entropy_beta:g} x policy entropy"
    mix = f"lambda {loss.value_lambda:g}"
    if loss.value_lambda_decay_steps:
        mix += f" to {loss.value_lambda_final:g} over {loss.value_lambda_decay_steps:,} steps"
    scale = "fitted per file" if s.data.eval_scale_fit == "per_file" else f"{s.data.eval_scale:g}"
    return f"{text}; value target {mix}, eval scale {scale}"


def _data_line(data) -> str:
    if not data.train:
        return f"{data.resolved_kind} (random batches, seeded)"
    options = []  # the target options a dlshogi user sets (--use_average, --temperature), visible before a run
    if data.use_average:
        options.append("duplicate positions averaged")
    if data.kind == "hcpe3" or (data.kind == "auto" and any(p.lower().endswith(".hcpe3") for p in data.train)):
        options.append(f"hcpe3 policy temperature {data.policy_temperature:g}")
    return (f"{data.resolved_kind}: train {list(data.train)}, test {list(data.test)}"
            + (f"; {', '.join(options)}" if options else ""))


def summary_text(resolved: Resolved) -> str:
    s = resolved.settings
    model = build_model(s.model)
    network = summarize_model(model)
    try:
        device = resolve_device(s.runtime).describe()
    except UserError as exc:  # summary still describes the run; train would stop here
        device = f"{s.runtime.device}, {s.runtime.precision}: train would refuse on this machine ({exc})"
    data = _data_line(s.data)
    try:
        check_teacher_data(s)
    except UserError as exc:  # described all the same, with what train would say
        data = f"{data}; train would refuse: {exc}"
    run_dir = run_dir_of(s)
    newest = latest_checkpoint(run_dir)
    start = f"would resume from {newest}" if newest else "would start at step 0 (no checkpoint yet)"
    if s.run.mode == "finetune" and not newest:
        start = f"would start at step 0 from the weights of {s.run.init_checkpoint}"
    try:
        check_start_step(s, run_dir)
    except UserError as exc:  # train's own words: "nothing to train: ... (raise it with ...)"
        start = f"{start}; {exc}"
    runtime = s.runtime
    rows = [
        ("Run", f"type {s.run.type}, network {s.run.network or '(model as given)'}, mode {s.run.mode}"),
        ("Network", f"{s.model.blocks} blocks x {s.model.channels} channels, {s.model.activation}; "
                    f"{network.total_parameters:,} parameters ({parameter_bytes(model) / 2**20:.1f} MiB fp32)"),
        ("Data", data),
        ("Batch", f"{s.optim.batch_size} positions per step per rank = {s.optim.accumulation_steps} "
                  f"micro-batch(es) of {s.optim.micro_batch_size}"),
        ("Optimizer", _optimizer_line(s.optim)),
        ("Loss", _loss_line(s)),
        ("Watchdog", (f"halt on a non-finite gradient norm, or one above {s.watchdog.factor:g} x its median of "
                      f"{s.watchdog.window} for {s.watchdog.consecutive} steps after {s.watchdog.warmup_steps}")
                     if s.watchdog.enabled else "off"),
        ("Device", f"{device}; tf32 {'on' if runtime.tf32 else 'off'}, "
                   f"compile {_compile(runtime)}, torch {torch.__version__}"),
        ("Steps", f"{runtime.max_steps:,} (seed {runtime.seed}); log every {runtime.log_every}, checkpoint "
                  f"every {runtime.checkpoint_every}, keep {runtime.keep_checkpoints}"),
        ("Run dir", f"{run_dir}: {start}"),
    ]
    if resolved.project_file:
        rows.append(("Project", str(resolved.project_file)))
    width = max(len(label) for label, _ in rows)
    settings = "\n".join(f"{label:<{width}}  {text}" for label, text in rows)
    return f"{format_model_summary(network)}\n\n{settings}"


def _compile(runtime: RuntimeSettings) -> str:
    if not runtime.compile:
        return "off"
    return "on" if runtime.compile_mode == "default" else f"on ({runtime.compile_mode})"
