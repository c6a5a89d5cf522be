"""kvbench: measure how KV-cache allocation, attention kernels and graph modes shape LLM serving.

Where a module lives: kvbench.plugins = plugins/, kvbench.kernels = kernels/, kvbench.conf =
conf/, and every other kvbench.* = harness/ (kvbench.core.scheduler = harness/core/scheduler.py).

    core/        the engine loop: sequence, workload, spec, scheduler (who runs), engine, recorder
    executors/   who runs a step: the contract (base), the roofline cost model, the real model executor
    model/       the tiny decoders: layers, linear-state layers, the attention op, sampling, reference
    scenarios/   build (config -> plugins -> engine), run (one point), simulate, serve, kernel
    reporting/   results files, comparison with a baseline, the HTML report, plots
    schema/      what a config may hold: a pydantic model per config group, checked before a point runs

Imports point one way: scenarios use executors, model and core; executors use model and core;
core uses only the allocator contract of plugins (allocators decide where tokens go); reporting
reads result files and imports none of them; nothing imports cli. docs/design.md draws the layers.
"""

__version__ = "0.1.0"
