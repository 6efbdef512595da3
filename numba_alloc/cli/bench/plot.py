"""The comparison as a figure with matplotlib: four panels of grouped bars,
one group per workload and one bar per manager."""

PANELS = (("alloc_host_s", "host time allocating (ms)", 1e3, True),
          ("wall_s", "wall time (s)", 1.0, False),
          ("alloc_p99_us", "allocation latency p99 (us)", 1.0, True),
          ("peak_reserved", "peak reserved (MiB)", 1 / 2**20, False))


def plot(summary, managers, path, title):
    """Write the figure of ``summary`` (see :func:`numba_alloc.cli.bench.suite.summarize`)
    to ``path`` (PNG). Figures that are missing are drawn as no bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    workloads = list(summary)
    width = 0.8 / len(managers)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    for ax, (key, label, factor, log) in zip(axes.flat, PANELS):
        for k, manager in enumerate(managers):
            values = [summary[w][manager][key] for w in workloads]
            positions = [i + (k - (len(managers) - 1) / 2) * width for i in range(len(workloads))]
            ax.bar([p for p, v in zip(positions, values) if v is not None],
                   [v * factor for v in values if v is not None], width, label=manager)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
