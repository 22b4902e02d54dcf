"""results.md for `benchmarks.gpu`: the figures of results.json as Markdown tables (no torch)."""

from __future__ import annotations

import datetime

from benchmarks.gpu_runs import LOADER_BATCHES


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _loss(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)  # events write NaN as "nan"


def _device_line(device: dict) -> str:
    parts = [f"torch {device['torch']}"]
    if device.get("cuda"):
        parts.append(f"CUDA {device['cuda']}, cuDNN {device['cudnn']}, compute capability {device['capability']}, "
                     f"{device['memory_bytes'] / 2**30:.0f} GiB")
    peak = device.get("peak_bf16_flops")
    parts.append(f"dense bf16 peak {peak / 1e12:,.0f} TFLOPS ({device['peak_source']})" if peak
                 else f"no peak FLOP/s, so no MFU ({device['peak_source']})")
    return "; ".join(parts)


def _smoke(smoke: dict | None) -> list[str]:
    if smoke is None:
        return ["Not run (`--skip-smoke`)."]
    return _training_run(smoke, "`configs/smoke.toml` with `runtime.device` set")


def _teacher(run: dict | None, by_workers: list[dict] | None = None) -> list[str]:
    if run is None:
        return ["Not run."]
    if run.get("skipped"):
        return [f"Skipped: {run['skipped']}."]
    lines = _training_run(run, f"`configs/smoke.toml` with {_sets(run)} on {run.get('records', 0):,} hcpe records "
                               f"of random games with {run.get('workers', 2)} decoding workers (the default)",
                          data_wait=True)
    if by_workers and len(by_workers) > 1:
        lines += ["", "The same run with more decoding workers, until the wait falls under 5% of step time:", "",
                  "| workers | positions/s (median window) | waiting for data | exit |", "| ---: | ---: | ---: | --- |"]
        for other in by_workers:
            wait = other.get("data_wait_fraction")
            lines.append(f"| {other.get('workers')} | {_rate(other.get('positions_per_second_median') or 0)} | "
                         f"{'-' if wait is None else f'{wait:.1%}'} | {other.get('exit_code')} "
                         f"{other.get('terminal')} |")
    return lines


def _unpinned(run: dict | None) -> list[str]:
    if not run or run.get("skipped") or not run.get("steps"):
        return []
    wait = run.get("data_wait_fraction")
    return [f"With `runtime.pin_memory=false` (plain copies) at the default workers: "
            f"{_rate(run.get('positions_per_second_median') or 0)} positions/s (median window), waiting for data "
            f"{'-' if wait is None else f'{wait:.1%}'} of step time; exit status {run['exit_code']}.", ""]


def _sets(run: dict) -> str:
    """The run's `--set` items beyond the device, directory and data path, as the reader would type them."""
    command = run.get("command") or []
    sets = [command[i + 1] for i, word in enumerate(command[:-1]) if word == "--set"]
    hidden = ("runtime.device", "runtime.out_dir", "runtime.progress", "data.train")
    shown = [s for s in sets if not s.startswith(hidden)]
    return ", ".join(f"`{s}`" for s in shown) or "its own settings"


def _hcpe3(run: dict | None) -> list[str]:
    if run is None:
        return ["Not run."]
    if run.get("skipped"):
        return [f"Skipped: {run['skipped']}."]
    return _training_run(run, f"{run.get('games', 0):,} sample games written as hcpe3 ({run.get('moves', 0):,} "
                              f"moves, {run.get('with_candidates', 0):,} with visit counts), {_sets(run)}",
                         data_wait=True)


def _resume(check: dict | None) -> list[str]:
    if check is None:
        return ["Not run."]
    lines = [f"Three smoke runs of {check['steps']} steps: two straight, one stopped at step {check['resumed_at']} "
             f"(`--stop-at-step`) and resumed. Exact (every logged loss and the final weights bit for bit): "
             f"**{'yes' if check['exact'] else 'no'}**; within the device's own run-to-run difference: "
             f"**{'yes' if check['within_device_noise'] else 'no'}**.", "",
             "| pair | steps compared | max loss difference | max weight difference | identical |",
             "| --- | ---: | ---: | ---: | --- |"]
    for pair in ("straight_vs_straight", "resumed_vs_straight"):
        row = check[pair]
        weights = row["max_weight_difference"]
        lines.append(f"| {pair.replace('_', ' ')} | {row['steps_compared']} | {row['max_loss_difference']:.3g} | "
                     f"{'-' if weights is None else f'{weights:.3g}'} | {row['identical']} |")
    return lines


def _match(match: dict | None) -> list[str]:
    if match is None:
        return ["Not run."]
    if match.get("skipped"):
        return [f"Skipped: {match['skipped']}."]
    lines = [f"`tideborn match` of the teacher run's last two checkpoints, {match['games']} games at once, "
             f"{match['max_moves']} plies at most, on each device (games per second of play, loading excluded):", "",
             "| device | games/s | seconds | moves | CPU threads |", "| --- | ---: | ---: | ---: | ---: |"]
    for device in ("cuda", "cpu"):
        row = match.get(device)
        if row is None:
            continue
        if row.get("error"):
            lines.append(f"| {device} | {row['error']} | | | |")
        else:
            lines.append(f"| {device} | {row['games_per_second']:.2f} | {row['seconds']:.2f} | {row['moves']:,} | "
                         f"{row['threads']} |")
    if match.get("ratio"):
        lines += ["", f"The GPU plays {match['ratio']:.1f}x the CPU's games per second."]
    return lines


def _match_wide(results: dict) -> list[str]:
    wide = results.get("match_wide")
    lines = []
    if wide and not wide.get("skipped"):
        lines += [f"With {wide['games']} games at once: " + ", ".join(
            f"{device} {wide[device]['games_per_second']:.2f} games/s" for device in ("cuda", "cpu")
            if device in wide and not wide[device].get("error"))
            + (f"; the GPU plays {wide['ratio']:.1f}x the CPU's games per second." if wide.get("ratio") else ".")]
    if results.get("match_profile"):
        lines += ["", f"Where the GPU match's time goes: `{results['match_profile']}` (cProfile, top 30 by own time)."]
    return lines


def _loader(rows: list[dict] | None) -> list[str]:
    if not rows:
        return ["Not run."]
    if rows[0].get("skipped"):
        return [f"Skipped: {rows[0]['skipped']}."]
    batches = rows[0].get("batches", LOADER_BATCHES)  # reports from before the count was recorded: the default
    lines = [f"`TeacherBatches.next_batch` in a loop, no training, {batches} batches of 1024 after ten of warm-up, "
             f"on the teacher run's records:", "",
             "| workers | pinned memory | planes packed | batches/s | positions/s |",
             "| ---: | --- | --- | ---: | ---: |"]
    for row in rows:
        lines.append(f"| {row['workers']} | {row['pin_memory']} | {row.get('packed', False)} | "
                     f"{row['batches_per_second']:,.1f} | {_rate(row['positions_per_second'])} |")
    return lines


def _training_run(run: dict, what: str, data_wait: bool = False) -> list[str]:
    """One `tideborn train` process of the check (`bench_gpu.training_run`'s figures), described as `what`."""
    if run.get("error"):
        return [f"**{run['error']}**; log: `{run['log']}`."]
    rate = run.get("positions_per_second")
    lines = [f"{what}: exit status {run['exit_code']}, terminal event "
             f"`{run['terminal']}`, {run['steps']} steps, loss {_loss(run['first_loss'])} -> "
             f"{_loss(run['final_loss'])}, last window {_rate(rate or 0)} positions/s, "
             f"{run['seconds']:.1f} s in all "
             f"(process start and torch import included). Device: `{run['device_used']}`. Log: `{run['log']}`."
             if run.get("steps") else
             f"exit status {run['exit_code']}, no step was logged; log: `{run['log']}`."]
    if data_wait and run.get("data_wait_fraction") is not None:
        lines.append(f"\nWaiting for data: {run['data_wait_fraction']:.1%} of step time after the first window.")
    return lines + _gpu_event(run)


def _gpu_event(smoke: dict) -> list[str]:
    """The run's first `gpu` event: what NVML reported through the trainer (absent figures: None)."""
    event = smoke.get("gpu_event")
    if not event:
        return []
    lines = ["", f"Its last `gpu` event (of {smoke.get('gpu_events', 1)}; NVML through the trainer; `None` where a "
                 f"figure was not available):", ""]
    for device in event.get("devices") or []:
        lines.append(f"- device {device.get('index')} {device.get('name')}: utilisation "
                     f"{device.get('utilization_percent')} %, memory used {device.get('memory_used_bytes')} of "
                     f"{device.get('memory_total_bytes')} bytes, {device.get('temperature_c')} C, "
                     f"{device.get('power_watts')} W")
    return lines


def _model_table(name: str, model: dict, rows: list[dict]) -> list[str]:
    lines = [f"### {name}", "",
             f"{model['blocks']} blocks x {model['channels']} channels, {model['parameters']:,} parameters, "
             f"{model['flops_per_position'] / 1e6:,.1f} MFLOP per position forward.", "",
             "| batch | variant | positions/s (median) | min - max | vs default | step ms | peak memory GiB "
             "| MFU | first step s |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    defaults = {r["batch_size"]: r for r in rows if r["variant"] == "default" and r["status"] == "ok"}
    for row in sorted(rows, key=lambda r: r["batch_size"]):
        head = f"| {row['batch_size']} | {row['variant']} |"
        if row["status"] != "ok":
            detail = row.get("reason") or row.get("error") or ""
            lines.append(f"{head} {row['status']} | {detail} | | | | | |")
            continue
        base = defaults.get(row["batch_size"])
        ratio = f"{row['positions_per_second'] / base['positions_per_second']:.2f}x" if base else "-"
        memory = f"{row['peak_memory_bytes'] / 2**30:.2f}" if row["peak_memory_bytes"] is not None else "-"
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        lines.append(f"{head} {_rate(row['positions_per_second'])} | {_rate(row['min'])} - {_rate(row['max'])} | "
                     f"{ratio} | {row['step_ms']:.1f} | {memory} | {mfu} | {row['first_step_seconds']:.1f} |")
    return lines + [""]


def _switch_effects(results: dict) -> list[str]:
    """Each variant against the default of its model and batch: which switches pay, which cost."""
    ok = [r for r in results["sweep"] if r["status"] == "ok"]
    defaults = {(r["model"], r["batch_size"]): r for r in ok if r["variant"] == "default"}
    lines = []
    for row in ok:
        base = defaults.get((row["model"], row["batch_size"]))
        if row["variant"] == "default" or base is None:
            continue
        ratio = row["positions_per_second"] / base["positions_per_second"]
        if row["min"] > base["max"]:
            verdict = "faster than the default, beyond the spread"
        elif row["max"] < base["min"]:
            verdict = "slower than the default, beyond the spread"
        else:
            verdict = "within the spread"
        lines.append(f"| {row['model']} | {row['batch_size']} | {row['variant']} | {ratio:.2f}x | {verdict} |")
    if not lines:
        return ["No variant ran beside a default."]
    return ["A variant `faster than the default, beyond the spread` that turns a switch off means the switch "
            "costs in that case; one that turns a switch on (e.g. `compile`) means it pays.", "",
            "| model | batch | variant | vs default | |", "| --- | ---: | --- | ---: | --- |", *lines]


def render_markdown(results: dict) -> str:
    device = results["device"]
    when = datetime.datetime.fromtimestamp(results["started_at"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    status = "finished" if results.get("finished") else "interrupted" if results.get("interrupted") else "in progress"
    lines = [f"# GPU check: {device['name']} ({device['device']})", "",
             f"{when}, tideborn {results['tideborn']}, {'quick' if results['quick'] else 'full'} sweep, "
             f"{status} after {results.get('seconds', 0):.0f} s.", "", _device_line(device) + ".", "",
             "## Smoke run", "", *_smoke(results.get("smoke")), "",
             "## Teacher-data run", "", *_teacher(results.get("teacher"), results.get("teacher_workers")), "",
             *_unpinned(results.get("teacher_unpinned")),
             "## hcpe3 run", "", *_hcpe3(results.get("hcpe3")), "",
             "## Resume", "", *_resume(results.get("resume")), "",
             "## Match speed", "", *_match(results.get("match")), "", *_match_wide(results), "",
             "## The teacher loader alone", "", *_loader(results.get("loader")), "",
             "## Training throughput", "",
             "The trainer's own step (`TrainingState.train_step`) on premade synthetic batches. Positions/s is the "
             "median of the repetitions after warm-up; MFU = positions/s x 3 x forward FLOPs per position / dense "
             "bf16 peak (backward counted as twice the forward). `first step` includes torch.compile and cuDNN's "
             "algorithm search.", ""]
    for name, model in results.get("models", {}).items():
        rows = [r for r in results["sweep"] if r["model"] == name]
        if rows:
            lines += _model_table(name, model, rows)
    lines += ["## Switch effects", "", *_switch_effects(results), ""]
    synced = [r for r in results["sweep"] if r.get("host_syncs_per_step")]
    if any(r.get("host_syncs_per_step") is not None for r in results["sweep"]):
        lines += ["## Host-device synchronisation inside the step", "",
                  "One step per configuration ran under `torch.cuda.set_sync_debug_mode(\"warn\")`."
                  + ("" if synced else " No step made the host wait for the GPU."), ""]
        for row in synced:
            what = "; ".join(sorted(set(row["host_syncs_per_step"])))
            lines.append(f"- {row['model']} batch {row['batch_size']} {row['variant']}: {what}")
        lines.append("")
    return "\n".join(lines)
