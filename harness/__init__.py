"""kvbench: measure how KV-cache allocation, attention kernels and graph modes shape LLM serving.

Where a module lives: kvbench.plugins = plugins/, kvbench.kernels = kernels/, kvbench.conf =
conf/, and every other kvbench.* = harness/ (kvbench.core.scheduler = harness/core/scheduler.py).

    core/        who runs and where tokens go: sequence, workload, spec, scheduler, engine, recorder
    executors/   who runs a step: the contract (base), the roofline cost model, the real model executor
    model/       the tiny decoders: layers, linear-state layers, the attention op, sampling, reference
    scenarios/   build (config -> plugins -> engine), run (one point), simulate, serve, kernel
    reporting/   results files, comparison with a baseline, the HTML report, plots
    schema/      what a config may hold: a pydantic model per config group, checked before a point runs

Imports point down that list's reverse: reporting and scenarios use core/executors/model; core
uses only plugins' base classes; nothing imports cli.
"""

__version__ = "0.1.0"
