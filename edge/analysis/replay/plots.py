"""PNG figures of a replay (paper 2611.14418 figures 10–13): flip recall and KL share against the
escalation budget, the bytes-versus-KL frontier with verified speculation, and accepted proposals per
round with tokens per round and bytes against k. Needs matplotlib (the `analysis` extra)."""

from pathlib import Path

import numpy as np

from edge.analysis.replay.trace import StepTrace
from edge.options.run import pyplot

ORDERS = {"entropy": "entropy", "margin": "margin (small first)", "oracle": "oracle (true KL)"}


def _curves(traces: list[StepTrace]) -> tuple[np.ndarray, dict, dict]:
    """Budget grid [B] and, per ordering, the share of flips and of KL mass escalated at each budget."""
    flips = np.concatenate([np.asarray(t.flip, float) for t in traces])
    kl = np.concatenate([np.asarray(t.kl) for t in traces])
    scores = {"entropy": np.concatenate([t.entropy for t in traces]),
              "margin": -np.concatenate([t.margin for t in traces]), "oracle": kl}
    grid = np.linspace(0, 1, 101)
    idx = np.round(grid * len(flips)).astype(int)
    recall, kl_share = {}, {}
    for name, s in scores.items():
        order = np.argsort(-s, kind="stable")
        recall[name] = np.concatenate(([0.0], np.cumsum(flips[order]) / max(flips.sum(), 1)))[idx]
        kl_share[name] = np.concatenate(([0.0], np.cumsum(kl[order]) / max(kl.sum(), 1e-30)))[idx]
    return grid, recall, kl_share


def save_plots(result: dict, traces: list[StepTrace], folder: Path, prefix: str) -> list[str]:
    """Write the four figures into `folder`; returns their paths."""
    plt = pyplot("--plots")
    folder.mkdir(parents=True, exist_ok=True)
    grid, recall, kl_share = _curves([t for t in traces if len(t)])
    title = f"{result['method']} ({result['rotation']}), {result['steps']} steps, {result['prompts']} prompts"
    paths = []

    def save(fig, name):
        path = folder / f"{prefix}-{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))

    for name, curves, ylabel in (("fig10-flip-recall", recall, "share of flips escalated"),
                                 ("fig11-kl-share", kl_share, "share of KL(high||low) mass escalated")):
        fig, ax = plt.subplots(figsize=(5.2, 4))
        for order, label in ORDERS.items():
            ax.plot(grid, curves[order], label=label)
        ax.plot(grid, grid, "k--", lw=1, label="random (expectation)")
        for r in result["budgets"]:
            ax.axvline(float(r), color="grey", lw=0.5, ls=":")
        ax.set(xlim=(0, 0.5), ylim=(0, 1.02), xlabel="share of steps escalated", ylabel=ylabel, title=title)
        ax.title.set_fontsize(8)
        ax.legend(fontsize=8)
        save(fig, name)

    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    cost = result["cost_model"]
    for order, marker in (("entropy", "o"), ("margin", "s"), ("oracle", "^"), ("random", "x")):
        pts = [(b["bytes_vs_high"]["gate"], b[order]["kl_left"]) for b in result["budgets"].values()]
        ax.plot(*zip(*pts), marker=marker, label=f"gate by {order}" if order != "random" else "random (expectation)")
    spec = result["speculation"]
    ax.plot([s["bytes_vs_high"] for s in spec.values()], [0] * len(spec), "D", color="k", label="verified speculation")
    for key, s in spec.items():
        ax.annotate(key, (s["bytes_vs_high"], 0), textcoords="offset points", xytext=(0, 6), fontsize=7)
    ax.plot([cost["all_low"]], [result["mean_kl"]], "v", color="r", label="all-low")
    ax.plot([1.0], [0.0], "*", color="g", ms=10, label="all-high")
    ax.set(xlabel="weight bytes per token / all-high (head in every pass)", ylabel="mean KL(high||low) left, nats",
           title=title)
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    save(fig, "fig12-frontier")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8))
    ks = list(spec)
    width = 0.8 / len(ks)
    for i, key in enumerate(ks):
        h = np.asarray(spec[key]["accepted_histogram"], float)
        a1.bar(np.arange(len(h)) + i * width, h / h.sum(), width=width, label=key)
    a1.set(xlabel="accepted proposals per round", ylabel="share of rounds")
    a1.legend(fontsize=8)
    kv = [int(k[1:]) for k in ks]
    a2.plot(kv, [spec[k]["tokens_per_round"] for k in ks], "o-", label="tokens per round")
    a2.set(xlabel="k (proposals per round)", ylabel="tokens per round")
    a3 = a2.twinx()
    a3.plot(kv, [spec[k]["bytes_vs_high"] for k in ks], "s--", color="C1", label="bytes / all-high")
    a3.set_ylabel("weight bytes per token / all-high")
    fig.suptitle(title, fontsize=8)
    save(fig, "fig13-speculation")
    return paths
