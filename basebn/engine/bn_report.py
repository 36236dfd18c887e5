"""BN health of trained weights: dead channels, non-finite buffers, running-vs-population drift, model-vs-EMA
drift, and a verdict. The computations behind ``python -m basebn.tools.bn_report``.

BN layers are found in a state dict by their ``NAME.running_mean`` / ``NAME.running_var`` keys (no model
needed for the static checks). Drift numbers are those of the BN-drift plot (``basebn.tools.plot.bn_drift``):
per layer, the channel mean of ``|running mean - population mean| / population std`` (the mean shift in
sigma units) and of ``running var / population var`` (the variance ratio), the population statistics being
precise BN's (:func:`basebn.layers.collect_bn_population_stats`) on training samples. A layer "drifts" when
its mean shift or ``|variance ratio - 1|`` exceeds ``DRIFT_THRESHOLD`` (5%).
"""
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import numpy as np

import megengine.module as M

from ..layers.precise_bn import collect_bn_population_stats

__all__ = ["DEAD_GAMMA", "DRIFT_THRESHOLD", "bn_prefixes", "static_health", "population_drift", "ema_drift",
           "build_report", "verdict", "format_table", "report_json", "plot_report"]

DEAD_GAMMA = 1e-3
"""A channel whose BN weight (gamma) is below this in absolute value is dead."""
DRIFT_THRESHOLD = 0.05
"""A layer drifts when its mean shift or ``|variance ratio - 1|`` exceeds this."""
_BUFFERS = ("weight", "bias", "running_mean", "running_var")


def bn_prefixes(state: Mapping[str, Any]) -> List[str]:
    """The BN layers of a state dict.

    Args:
        state: a state dict (name -> array).

    Returns:
        The layer names NAME for which `state` holds both NAME.running_mean and NAME.running_var, in key order.
    """
    names = [k[:-len(".running_mean")] for k in state if k.endswith(".running_mean")]
    return [n for n in names if f"{n}.running_var" in state]


def _flat(state, key):
    v = state.get(key)
    return None if v is None else np.asarray(v, dtype=np.float64).ravel()


def static_health(state: Mapping[str, Any], eps: Union[None, float, Dict[str, float]] = None
                  ) -> List[Dict[str, Any]]:
    """The checks that need no model and no data: dead channels and non-finite buffers per BN layer.

    A channel is dead when ``|gamma| < DEAD_GAMMA`` or its running variance ``< eps``.

    Args:
        state: a state dict (name -> array).
        eps: the layers' BN eps: ``{layer name: eps}`` or one number (default 1e-5).

    Returns:
        One ``{"name", "channels", "dead": [channel indices], "non_finite": {buffer: count}}`` per BN layer.
    """
    rows = []
    for name in bn_prefixes(state):
        layer_eps = eps.get(name, 1e-5) if isinstance(eps, dict) else (1e-5 if eps is None else float(eps))
        var = _flat(state, f"{name}.running_var")
        gamma = _flat(state, f"{name}.weight")
        dead = var < layer_eps
        if gamma is not None and gamma.shape == var.shape:
            dead = dead | (np.abs(gamma) < DEAD_GAMMA)
        non_finite = {}
        for buf in _BUFFERS:
            v = _flat(state, f"{name}.{buf}")
            if v is not None and not np.all(np.isfinite(v)):
                non_finite[buf] = int(np.size(v) - np.isfinite(v).sum())
        rows.append({"name": name, "channels": int(var.size), "dead": [int(i) for i in np.flatnonzero(dead)],
                     "non_finite": non_finite})
    return rows


def _shift_and_ratio(mean_a, var_a, mean_ref, var_ref):
    """(channel mean of |mean_a - mean_ref| / std_ref, channel mean of var_a / var_ref), as the drift plot."""
    var_ref = np.maximum(np.asarray(var_ref, dtype=np.float64), 1e-12)
    shift = np.abs(np.asarray(mean_a, dtype=np.float64) - mean_ref) / np.sqrt(var_ref)
    return float(np.mean(shift)), float(np.mean(np.asarray(var_a, dtype=np.float64) / var_ref))


def population_drift(model: M.Module, loader: Iterable, num_samples: int) -> Dict[str, Dict[str, float]]:
    """``model``'s running statistics against the population statistics of training samples (precise BN's
    pass; writes nothing).

    Args:
        model: the model with its trained BN layers.
        loader: batches of training images (as precise BN reads them).
        num_samples: how many samples the population statistics are over.

    Returns:
        ``{layer name: {"mean_shift", "var_ratio", "count"}}``.
    """
    pop = collect_bn_population_stats(model, loader, num_samples)
    modules = dict(model.named_modules())
    out = {}
    for name, (count, mean, var) in pop.items():
        m = modules[name]
        shift, ratio = _shift_and_ratio(m.running_mean.numpy().ravel(), m.running_var.numpy().ravel(), mean, var)
        out[name] = {"mean_shift": shift, "var_ratio": ratio, "count": int(count)}
    return out


def ema_drift(model_state: Mapping[str, Any], ema_state: Mapping[str, Any]) -> Dict[str, Dict[str, float]]:
    """The model's running statistics against the EMA's (the EMA as the reference), per BN layer in both.

    Args:
        model_state: the model's state dict.
        ema_state: the EMA's state dict.

    Returns:
        ``{layer name: {"mean_shift", "var_ratio", "gamma_rel"}}``; ``gamma_rel`` (the relative L2 distance of
        gamma) where both hold a weight of the same shape.
    """
    out = {}
    for name in bn_prefixes(model_state):
        if f"{name}.running_mean" not in ema_state or f"{name}.running_var" not in ema_state:
            continue
        shift, ratio = _shift_and_ratio(_flat(model_state, f"{name}.running_mean"),
                                        _flat(model_state, f"{name}.running_var"),
                                        _flat(ema_state, f"{name}.running_mean"),
                                        _flat(ema_state, f"{name}.running_var"))
        row = {"mean_shift": shift, "var_ratio": ratio}
        g, ge = _flat(model_state, f"{name}.weight"), _flat(ema_state, f"{name}.weight")
        if g is not None and ge is not None and g.shape == ge.shape:
            row["gamma_rel"] = float(np.linalg.norm(g - ge) / max(np.linalg.norm(ge), 1e-12))
        out[name] = row
    return out


def _drifts(row):
    return row["mean_shift"] > DRIFT_THRESHOLD or abs(row["var_ratio"] - 1.0) > DRIFT_THRESHOLD


def build_report(state: Mapping[str, Any], eps: Union[None, float, Dict[str, float]] = None,
                 population: Optional[Dict[str, Dict[str, float]]] = None,
                 ema: Optional[Dict[str, Dict[str, float]]] = None, source: str = "") -> Dict[str, Any]:
    """The BN health report of a state dict.

    Args:
        state: the state dict (name -> array) of the weights checked.
        eps: the layers' BN eps, as :func:`static_health` takes it.
        population: :func:`population_drift`'s rows, or None when not checked.
        ema: :func:`ema_drift`'s rows, or None when not checked.
        source: where the weights came from, shown in the report.

    Returns:
        The report dict: ``layers`` (static health, with the ``population`` / ``ema`` drift rows merged in by
        name when given), ``summary`` counts and ``verdict`` lines.
    """
    layers = static_health(state, eps)
    for row in layers:
        if population is not None and row["name"] in population:
            row["population"] = population[row["name"]]
        if ema is not None and row["name"] in ema:
            row["ema"] = ema[row["name"]]
    report = {"source": str(source), "layers": layers, "threshold": DRIFT_THRESHOLD, "dead_gamma": DEAD_GAMMA,
              "population_checked": population is not None, "ema_checked": ema is not None}
    report["summary"] = {
        "layers": len(layers),
        "layers_with_dead_channels": sum(bool(r["dead"]) for r in layers),
        "dead_channels": sum(len(r["dead"]) for r in layers),
        "layers_non_finite": sum(bool(r["non_finite"]) for r in layers),
        "layers_drifting": sum(_drifts(r["population"]) for r in layers if "population" in r),
        "layers_population_checked": sum("population" in r for r in layers),
        "layers_ema_drifting": sum(_drifts(r["ema"]) for r in layers if "ema" in r),
    }
    report["verdict"] = verdict(report)
    return report


def verdict(report: Dict[str, Any]) -> List[str]:
    """The verdict of a report.

    Args:
        report: a :func:`build_report` dict (its ``summary`` is read).

    Returns:
        Verdict lines, the most serious first; the last one is about precise BN.
    """
    s, lines = report["summary"], []
    pct = f"{100 * DRIFT_THRESHOLD:g}%"
    if s["layers_non_finite"]:
        lines.append(f"non-finite BN buffers in {s['layers_non_finite']} of {s['layers']} layers: these weights "
                     f"give NaN outputs; use an earlier checkpoint")
    if s["dead_channels"]:
        lines.append(f"{s['dead_channels']} dead channel(s) in {s['layers_with_dead_channels']} of {s['layers']} "
                     f"layers (|gamma| < {DEAD_GAMMA:g} or running var < eps): prunable, or a sign of too strong "
                     f"weight decay on BN")
    if report["ema_checked"]:
        lines.append(f"model vs EMA: {s['layers_ema_drifting']} of {s['layers']} layers differ > {pct}")
    if not report["population_checked"]:
        lines.append("population drift not checked (give a config, or a run directory, and --data-samples > 0)")
    elif s["layers_drifting"]:
        lines.append(f"precise BN recommended: {s['layers_drifting']} of {s['layers_population_checked']} layers "
                     f"drift > {pct}")
    else:
        lines.append(f"running statistics match the population: 0 of {s['layers_population_checked']} layers "
                     f"drift > {pct}")
    return lines


def format_table(report: Dict[str, Any]) -> str:
    """The report as text.

    Args:
        report: a :func:`build_report` dict.

    Returns:
        One row per BN layer, then the verdict lines.
    """
    head = f"{'layer':<40} {'C':>5} {'dead':>5} {'non-finite':>12} {'mean shift':>11} {'var ratio':>10}"
    if report["ema_checked"]:
        head += f" {'EMA shift':>10} {'EMA var':>8}"
    lines = [f"BN report: {report['source']}", head]
    for r in report["layers"]:
        bad = ",".join(f"{k}:{v}" for k, v in r["non_finite"].items()) or "-"
        pop = r.get("population")
        line = (f"{r['name']:<40} {r['channels']:>5} {len(r['dead']):>5} {bad:>12} "
                + (f"{pop['mean_shift']:>11.4f} {pop['var_ratio']:>10.4f}" if pop else f"{'-':>11} {'-':>10}"))
        if report["ema_checked"]:
            e = r.get("ema")
            line += f" {e['mean_shift']:>10.4f} {e['var_ratio']:>8.4f}" if e else f" {'-':>10} {'-':>8}"
        lines.append(line)
    return "\n".join(lines + report["verdict"])


def report_json(report: Dict[str, Any]) -> str:
    """The report as one JSON string.

    Args:
        report: a :func:`build_report` dict.

    Returns:
        Its JSON text, NaN and inf written as strings.
    """
    def clean(v):
        if isinstance(v, float) and not np.isfinite(v):
            return str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(report))


def plot_report(report: Dict[str, Any], path: str, pyplot: Any) -> str:
    """Bars per BN layer: population mean shift and variance ratio - 1 (the EMA's too when checked), and dead
    channels.

    Args:
        report: a :func:`build_report` dict.
        path: the image file to write.
        pyplot: the ``matplotlib.pyplot`` module to draw with (matplotlib is optional, so the caller imports it).

    Returns:
        `path`.
    """
    rows = report["layers"]
    names = [r["name"] for r in rows]
    x = np.arange(len(names))
    fig, axes = pyplot.subplots(3, 1, figsize=(max(8, 0.4 * len(names)), 8), sharex=True)
    series = [("population", "running vs population")] + ([("ema", "model vs EMA")] if report["ema_checked"] else [])
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        axes[0].bar(x + offset, [r[key]["mean_shift"] if key in r else np.nan for r in rows], width, label=label)
        axes[1].bar(x + offset, [r[key]["var_ratio"] - 1.0 if key in r else np.nan for r in rows], width,
                    bottom=1.0, label=label)
    for ax in axes[:2]:
        ax.axhline(DRIFT_THRESHOLD if ax is axes[0] else 1.0, color="k", lw=0.8, ls="--")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set(ylabel="mean shift (sigma)", title=report["verdict"][-1])
    axes[1].set(ylabel="var ratio")
    axes[2].bar(x, [len(r["dead"]) for r in rows], color="tab:red")
    axes[2].set(ylabel="dead channels")
    axes[2].set_xticks(x)
    axes[2].set_xticklabels(names, rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot.close(fig)
    return path
