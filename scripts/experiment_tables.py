"""The experiment tables of the user guide, rendered from their results files (standard library only).

A page holds ``<!-- table:NAME:start -->`` and ``<!-- table:NAME:end -->`` around each table; NAME is a results
file's stem (results/NAME.json) and RENDERERS[NAME] turns the file's last run of kind "table" into markdown.
scripts/make_figures.py writes them with the figure tables, and tests/test_figures.py compares them.
"""

__all__ = ["RENDERERS", "last_table_run", "interval"]


def last_table_run(data):
    """The last run of kind "table" of a results file (the one the page shows)."""
    runs = [r for r in data["runs"] if r.get("kind") == "table"]
    if not runs:
        raise ValueError("no run of kind 'table'")
    return runs[-1]


def interval(summary, fmt="{:.1f}", signed=False):
    """'mean [min, max]' of a {"mean", "min", "max"} summary, one cell."""
    f = (lambda v: ("+" if v > 0 else "") + fmt.format(v)) if signed else fmt.format
    return f"{f(summary['mean'])} [{f(summary['min'])}, {f(summary['max'])}]"


def _provenance(run, name):
    """'HOST, commit C ([results/NAME.json](...))'; a run transcribed from the docs names the commit that wrote it."""
    commit = run["commit"][:12] if run.get("commit") else (
        f"not recorded; figures first written in {run['recorded_in'][:12]}" if run.get("recorded_in")
        else "not recorded")
    return f"{run['host']['name']}, commit {commit} ([results/{name}.json](../results/{name}.json))"


def render_bn_noniid(data):
    """BN / BRN / GN / ghost BN / SyncBN by sampling: eval-mode top-1 and the train-minus-eval mode gap."""
    run = last_table_run(data)
    figures = run["figures"]
    samplings = list(next(iter(next(iter(figures.values())).values())))
    head = (["batch", "norm"] + [f"top-1, {s}" for s in samplings] + [f"mode gap, {s}" for s in samplings])
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (2 * len(samplings))]
    for batch, norms in figures.items():
        for norm, by_sampling in norms.items():
            cells = [interval(by_sampling[s]["top1"]) for s in samplings]
            cells += [interval(by_sampling[s]["mode_gap"], signed=True) for s in samplings]
            lines.append(f"| {batch.split()[-1]} | {norm} | " + " | ".join(cells) + " |")
    lines += ["", "Against BN at the same batch and sampling, paired by seed (top-1 points, mean [min, max]):", "",
              "| batch | norm | " + " | ".join(f"vs BN, {s}" for s in samplings) + " |",
              "|---|---|" + "---:|" * len(samplings)]
    for batch, norms in figures.items():
        for norm, by_sampling in norms.items():
            if norm == "BN":
                continue
            cells = [interval(_paired(by_sampling[s]["top1"], norms["BN"][s]["top1"]), signed=True)
                     for s in samplings]
            lines.append(f"| {batch.split()[-1]} | {norm} | " + " | ".join(cells) + " |")
    lines += ["", f"{run['conditions']}. Measured on {_provenance(run, 'bn_noniid')}."]
    return "\n".join(lines)


def _paired(summary, reference):
    """{"mean", "min", "max"} of the per-seed differences of two summaries holding "seeds" in the same order."""
    d = [a - b for a, b in zip(summary["seeds"], reference["seeds"])]
    return {"mean": sum(d) / len(d), "min": min(d), "max": max(d)}


# column heads of the Fashion-MNIST-C corruptions (results/fmnist_c.json names them in full)
FMNIST_C_SHORT = {"gaussian_noise": "gauss", "shot_noise": "shot", "impulse_noise": "impulse",
                  "defocus_blur": "defocus", "glass_blur": "glass", "motion_blur": "motion", "zoom_blur": "zoom",
                  "snow": "snow", "frost": "frost", "fog": "fog", "brightness": "bright", "contrast": "contrast",
                  "elastic_transform": "elastic", "pixelate": "pixel", "jpeg_compression": "jpeg"}
TENT_ANCHOR_ROWS = {"source": "source (≈ none)", "norm": "norm (≈ bn_batch)", "tent": "tent"}


def _error(value, bold=False):
    """One error cell: one decimal, "—" for a cell not run yet."""
    if value is None:
        return "—"
    return f"**{value:.1f}**" if bold else f"{value:.1f}"


def render_fmnist_c(data):
    """Fashion-MNIST-C top-1 error (%): per model, rows (severity, test batch, --adapt), columns the mean over the
    corruptions, clean, each corruption; then TENT's CIFAR-10-C rows, a scale reference."""
    run = last_table_run(data)
    figures, cond = run["figures"], run["conditions"]
    corruptions = cond["corruptions"]
    shorts = " | ".join(FMNIST_C_SHORT[c] for c in corruptions)
    lines = []
    for label, by_severity in figures["models"].items():
        lines += [f"`{label}`:", "", f"| severity | batch | --adapt | mean ({len(corruptions)}) | clean | {shorts} |",
                  "|---:|---:|---|" + "---:|" * (len(corruptions) + 2)]
        for severity, by_batch in by_severity.items():
            for batch, by_method in by_batch.items():
                for method, row in by_method.items():
                    cells = [_error(row["mean"], bold=True), _error(row["clean"])]
                    cells += [_error(row[c]) for c in corruptions]
                    lines.append(f"| {severity.split()[-1]} | {batch.split()[-1]} | {method} | "
                                 + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"| CIFAR-10-C, WRN-28-10, severity 5, batch 200 (TENT's README) | mean ({len(corruptions)}) | "
              f"mean (15) | {shorts} |", "|---|" + "---:|" * (len(corruptions) + 2)]
    for anchor, row in figures["tent_cifar10c"].items():
        cells = [_error(row["mean"], bold=True), _error(row["mean_15"])] + [_error(row[c]) for c in corruptions]
        lines.append(f"| {TENT_ANCHOR_ROWS.get(anchor, anchor)} | " + " | ".join(cells) + " |")
    missing = f"; {cond['cells_missing']} cells not run yet (—)" if cond["cells_missing"] else ""
    per_cell = ", ".join(f"{m} {s:.0f} s" for m, s in cond["seconds_per_cell"].items())
    lines += ["", f"Top-1 error (%) on {cond['images_per_set']:,} test images per set{missing}. "
                  f"{cond['machine_minutes']:.0f} min of machine time (per cell: {per_cell}), measured on "
                  f"{_provenance(run, 'fmnist_c')}."]
    return "\n".join(lines)


def render_bn_training(name):
    """The renderer of one experiments/bn_training_table.py section (results/NAME.json): each configuration's top-1
    and its paired difference against the section's reference, mean [min, max] over seeds, and the
    running-statistics drift where the section measured it."""
    def render(data):
        run = last_table_run(data)
        figures = run["figures"]
        configs = figures["configurations"]
        with_drift = any("drift" in c for c in configs.values())
        lines = [f"| configuration | top-1 | vs {figures['reference']} (paired) |"
                 + (" running-stat drift |" if with_drift else ""), "|---" * (4 if with_drift else 3) + "|"]
        for label, c in configs.items():
            diff = interval(c["vs_reference"], "{:+.2f}") if c.get("vs_reference") else "-"
            row = f"| {label} | {interval(c['top1'], '{:.2f}')} | {diff} |"
            if with_drift:
                row += f" {interval(c['drift'], '{:.4f}')} |"
            lines.append(row)
        lines += ["", f"{run['conditions']}; measured on {_provenance(run, name)}."]
        return "\n".join(lines)
    return render


def _count(n):
    """272 K / 1.73 M / 4.09 G: three significant digits."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


MODELS_HEAD = ["| model | params | MACs | input | BN features verified |", "|---|---|---|---|---|"]


def model_row(name, m):
    """One model's row of the models table (experiments/models_table.py prints the same rows as it counts)."""
    return (f"| `{name}` | {_count(m['params'])} | {_count(m['macs'])} | {m['input']} | "
            f"{m['features']} ({m['verified_on']}) |")


def render_models(data):
    """Every model name: parameters, MACs at its default input, that input, the BN features verified (and on which
    model of its family)."""
    run = last_table_run(data)
    lines = MODELS_HEAD + [model_row(name, m) for name, m in run["figures"]["models"].items()]
    lines += ["", f"Counted on {_provenance(run, 'models')}."]
    return "\n".join(lines)


def render_zoo_ablation(data):
    """Each BN technique of the zoo's runs: mean top-1 and the delta against the same seed's baseline (with its
    [min, max] over several seeds), and the seeds behind it."""
    run = last_table_run(data)
    lines = ["| technique | top-1 (mean) | Δ vs baseline (mean [min, max]) | seeds |", "|---|---|---|---|"]
    for label, t in run["figures"]["techniques"].items():
        d = t.get("vs_baseline")
        delta = "—" if d is None else interval(d, "{:+.2f}") if len(t["seeds"]) > 1 else f"{d['mean']:+.2f}"
        seeds = f"{len(t['seeds'])} ({', '.join(map(str, t['seeds']))})"
        lines.append(f"| {label} | {t['top1']['mean']:.2f} | {delta} | {seeds} |")
    lines += ["", f"{run['conditions']}; measured on {_provenance(run, 'zoo_ablation')}."]
    return "\n".join(lines)


def render_bn_freeze(data):
    """Each schedule: the highest lr of the frozen epoch, top-1 without and with the last epoch frozen, the paired
    difference, and the seeds whose frozen run stopped non-finite (with the frozen step)."""
    run = last_table_run(data)
    lines = ["| schedule | frozen epoch's lr (of peak) | top-1, not frozen | top-1, last epoch frozen | "
             "frozen − not frozen (paired) | frozen loss peak / loss before, worst seed | diverged when frozen |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for schedule, row in run["figures"].items():
        lr = row["frozen_epoch_lr"]
        cells = [f"{lr['highest']:g} ({lr['of_peak']:.2g})"]
        cells += [interval(row[k]["top1"], "{:.2f}") if row[k]["top1"] else "—" for k in ("freeze 0", "freeze 1")]
        cells.append(interval(row["paired_difference"], "{:.2f}", signed=True) if row["paired_difference"] else "—")
        jumps = [peak / before for before, peak in row["freeze 1"].get("loss_before_freeze_and_frozen_peak",
                                                                        {}).values() if before and peak]
        cells.append(f"{max(jumps):.1f}×" if jumps else "—")
        stopped = row["freeze 1"]["diverged_at_frozen_step"]
        cells.append(", ".join(f"seed {s} (step {n})" for s, n in stopped.items()) if stopped else "none of "
                     f"{len(row['freeze 1']['seeds'])}")
        lines.append(f"| {schedule} | " + " | ".join(cells) + " |")
    lines += ["", f"{run['conditions']}. Measured on {_provenance(run, 'bn_freeze')}."]
    return "\n".join(lines)


RENDERERS = {"bn_noniid": render_bn_noniid, "bn_freeze": render_bn_freeze, "fmnist_c": render_fmnist_c,
             "bn_training_small": render_bn_training("bn_training_small"),
             "bn_training_accum": render_bn_training("bn_training_accum"),
             "bn_training_large": render_bn_training("bn_training_large"),
             "models": render_models, "zoo_ablation": render_zoo_ablation}
