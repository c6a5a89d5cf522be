"""Built-in graph modes: eager, full (whole decode step captured), piecewise (split at attention)."""

from kvbench.hookspecs import hookimpl


@hookimpl
def kvbench_graph_modes():
    from kvbench.plugins.graphs.eager import EagerGraph
    from kvbench.plugins.graphs.full import FullGraph
    from kvbench.plugins.graphs.piecewise import PiecewiseGraph

    return [EagerGraph, FullGraph, PiecewiseGraph]
