"""Plugins arrive through pluggy: built-ins and third-party alike, names unique, errors helpful."""

import contextlib
import types
from typing import Annotated

import pytest
from hydra import compose, initialize_config_module
from pydantic import Field

from kvbench.errors import UserError
from kvbench.hookspecs import hookimpl
from kvbench.plugins.allocators.base import KVAllocator
from kvbench.plugins.allocators.contiguous import OracleAllocator
from kvbench.registry import Registry, default_registry
from kvbench.scenarios.run import run_point


class HalfOracleAllocator(OracleAllocator):
    """A third-party policy: reserve prompt + output, but in a pool it sees as half the size."""

    name = "half_oracle"

    def __init__(self, num_slots, max_model_len, block_size=16, **options):
        super().__init__(num_slots // 2, max_model_len, block_size, **options)


def plugin_module(*classes, hook: str = "kvbench_allocators"):
    """A third-party plugin module whose `hook` returns `classes`."""
    module = types.ModuleType("third_party_kv")
    setattr(module, hook, hookimpl(specname=hook)(lambda: list(classes)))
    return module


@contextlib.contextmanager
def plugged_in(allocator, num_requests: int):
    """`allocator` registered for the block's length, and the config of a simulated run of it
    (built on the oracle allocator's config group, its name replaced)."""
    registry = default_registry()
    module = plugin_module(allocator)
    registry.register(module)
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            overrides = [
                "+allocator=oracle",
                f"allocator.name={allocator.name}",
                f"workload.num_requests={num_requests}",
            ]
            yield compose("bench", overrides=[*overrides, "progress=false"])
    finally:
        registry.unregister(module)


def test_built_ins_register_through_the_entry_point_group():
    registry = Registry()
    assert {"contiguous", "oracle", "pow2", "paged"} <= set(registry.classes("allocator"))
    assert {"eager", "triton_paged"} <= set(registry.classes("backend"))


def test_an_external_plugin_is_found_by_name_and_runs_a_simulation():
    with plugged_in(HalfOracleAllocator, 40) as cfg:
        row = run_point(cfg)[0]
    assert row["allocator"] == "half_oracle"
    assert row["completed"] == 40
    assert row["kv_capacity_tokens"] < 10_000  # half of OPT-13B's ~15.8K slots


def test_a_duplicate_name_is_an_error_naming_both_sources():
    registry = Registry()
    clash = type("Clash", (OracleAllocator,), {"name": "paged"})
    registry.register(plugin_module(clash), name="third_party_kv")
    with pytest.raises(UserError) as err:
        registry.classes("allocator")
    assert "third_party_kv" in str(err.value) and "kvbench" in str(err.value)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(UserError, match="known: .*contiguous.*paged"):
        Registry().get("allocator", "bogus")


def broken_hook(result):
    module = types.ModuleType("broken_kv")

    @hookimpl
    def kvbench_allocators():
        if isinstance(result, Exception):
            raise result
        return result

    module.kvbench_allocators = kvbench_allocators
    return module


@pytest.mark.parametrize(
    "result, said",
    [
        (RuntimeError("hook exploded"), r"from broken_kv \(kvbench_allocators\) failed: RuntimeError: hook exploded"),
        (HalfOracleAllocator, "returned <class '.*HalfOracleAllocator'>; the hook returns a list of classes"),
        ([HalfOracleAllocator, "not a class"], "returned 'not a class', not a class"),
        ([type("IntName", (OracleAllocator,), {"name": 5})], "IntName.name is 5; a allocator is named by a str"),
    ],
)
def test_a_broken_plugin_hook_is_one_line_naming_it_not_a_traceback_in_every_run(result, said):
    """It raised out of every run, those that chose no plugin too (the registry is read by the
    config's checks): a TypeError, AttributeError or the hook's own exception."""
    registry = Registry()
    registry.register(broken_hook(result), name="broken_kv")
    with pytest.raises(UserError, match=said):
        registry.classes("allocator")


def test_a_chosen_plugin_that_breaks_its_contract_is_refused_when_chosen_only():
    class Unfinished(KVAllocator):  # its abstract methods left
        name = "unfinished"

    stranger = type("Stranger", (), {"name": "stranger"})
    registry = Registry()
    registry.register(plugin_module(Unfinished, stranger), name="third_party_kv")
    assert registry.get("allocator", "paged")  # the others still run
    with pytest.raises(UserError, match="allocator 'unfinished' .* does not implement .*admit"):
        registry.get("allocator", "unfinished")
    with pytest.raises(UserError, match="allocator 'stranger' .* does not extend KVAllocator"):
        registry.get("allocator", "stranger")


class OverCounting(OracleAllocator):
    """Counts more token states than its pool holds: free space, the remainder, went negative."""

    name = "over_counting"

    def kv_slots(self):
        token, *rest = super().kv_slots()
        return (token + 10 * self.num_slots, *rest)


class NegativeCounting(OracleAllocator):
    name = "negative_counting"

    def kv_slots(self):
        token, reserved, *rest = super().kv_slots()
        return (token, -1 - reserved, *rest)


class NamingTooFew(OracleAllocator):
    """Names half the slots it holds: published as kv_blocks_saved_frac -1.0, status ok."""

    name = "naming_too_few"

    def kv_slots(self):
        *counts, named = super().kv_slots()
        return (*counts, named // 2)


class Fractional(OracleAllocator):
    """Half a token state: cut to a whole number and published."""

    name = "fractional"

    def kv_slots(self):
        token, *rest = super().kv_slots()
        return (token + 0.5, *rest)


@pytest.mark.parametrize(
    "allocator, said",
    [
        (OverCounting, "at step 0 .* is not a split"),
        (NegativeCounting, "at step 0 .* is not a split"),
        (NamingTooFew, "at step 0 names .* slots in its block tables but holds"),
        (Fractional, r"kv_slots\(\) gave token .*\.5 at step 0, a count that is no whole number"),
    ],
)
def test_an_allocator_whose_accounting_is_no_split_of_its_pool_is_refused_not_reported(allocator, said):
    """It was published with status ok: token states 685.9 %, free -586.2 %."""
    with plugged_in(allocator, 20) as cfg:
        with pytest.raises(UserError, match=f"allocator {allocator.name}'s accounting:? {said}"):
            run_point(cfg)


class Spare(OracleAllocator):
    name = "spare"

    def __init__(self, num_slots, max_model_len, block_size=16, spare_blocks: int = 0, **options):
        super().__init__(num_slots - spare_blocks * block_size, max_model_len, block_size, **options)


@pytest.mark.parametrize("value, said", [("3", "allocator.spare_blocks='3' must be an integer"), (True, "=true")])
def test_a_plugin_s_int_option_refuses_text_and_booleans_which_the_run_would_pass_on(value, said):
    """'3' reached the constructor as text (a TypeError mid-run) and true ran as 1, recorded as true."""
    from kvbench.schema import check_plugin_options

    check_plugin_options("allocator", Spare, {"spare_blocks": 3})
    with pytest.raises(UserError, match=said):
        check_plugin_options("allocator", Spare, {"spare_blocks": value})


def test_a_plugin_s_int_option_takes_a_whole_float_as_kvbench_s_own_do_and_names_its_own_keys():
    from hydra.errors import ConfigCompositionException

    from kvbench.schema import check_plugin_options, settle_whole_numbers, validate
    from kvbench.schema.hydra_errors import hydra_line

    assert check_plugin_options("allocator", Spare, {"spare_blocks": 2.0}) == {"spare_blocks": 2}
    registry = default_registry()
    module = plugin_module(Spare)
    registry.register(module)
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            chosen = ["+allocator=oracle", "allocator.name=spare"]
            cfg = compose("bench", overrides=[*chosen, "+allocator.spare_blocks=2e0"])
            settle_whole_numbers(cfg, validate(cfg))
            assert cfg.allocator.spare_blocks == 2 and type(cfg.allocator.spare_blocks) is int
            with pytest.raises(ConfigCompositionException) as composing:
                compose("bench", overrides=[*chosen, "allocator.spare_block=3"])
            # a sweep's point of a built-in allocator given the plugin's option: its keys were listed as the only ones
            with pytest.raises(ConfigCompositionException) as mixed:
                compose("bench", overrides=["+allocator=paged", "allocator.spare_blocks=4"])
            mixed_line = hydra_line(mixed.value)  # while the plugin is installed, as a run's error is read
    finally:
        registry.unregister(module)
    assert mixed_line.startswith(
        "allocator.spare_blocks is an option of allocator=spare (a plugin from another package), not of every"
    )
    line = hydra_line(composing.value)
    assert line.startswith("allocator.spare_block is not a key of allocator=spare's config")
    assert "(its keys: name, block_size" in line
    assert "is added with +allocator.spare_block=VALUE" in line


class Inflated(OracleAllocator):
    """Builds its pool ten times the size it is given: its rows reported memory the point never had."""

    name = "inflated"

    def __init__(self, num_slots, max_model_len, block_size=16, **options):
        super().__init__(num_slots * 10, max_model_len, block_size, **options)


def test_an_allocator_that_makes_a_pool_larger_than_it_was_given_is_refused():
    with plugged_in(Inflated, 20) as cfg:
        with pytest.raises(
            UserError, match="allocator inflated made a pool of .* token slots from the .* it was given"
        ):
            run_point(cfg)


def test_a_search_path_package_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    """Hydra imports a pkg:// search path's package while it composes: its exception was a
    70-line traceback."""
    from kvbench import cli

    from helpers.cli import refused

    (tmp_path / "broken_conf_pkg").mkdir()
    (tmp_path / "broken_conf_pkg" / "__init__.py").write_text("raise RuntimeError('failed to import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    said = refused(lambda: cli.main(["hydra.searchpath=[pkg://broken_conf_pkg.conf]", "progress=false"]))
    assert "a package of hydra.searchpath cannot be imported (RuntimeError: failed to import)" in said


class NoKeywords(OracleAllocator):
    """Takes no **options: the options its bases take never reach them."""

    name = "no_keywords"

    def __init__(self, num_slots, max_model_len, block_size=16, model=None, spare: int = 0):
        super().__init__(num_slots, max_model_len, block_size, model=model)


class NoModel(OracleAllocator):
    name = "no_model"

    def __init__(self, num_slots, max_model_len, block_size=16):
        super().__init__(num_slots, max_model_len, block_size)


class Ranged(OracleAllocator):
    name = "ranged"

    def __init__(
        self, num_slots, max_model_len, spare: Annotated[int, Field(ge=0, le=8)] = 0, slack: float = 0.0, **options
    ):
        super().__init__(num_slots, max_model_len, **options)


def test_a_plugin_s_options_are_what_its_constructor_takes_its_ranges_kept_and_floats_finite():
    """NoKeywords was told it accepts watermark and placement (its bases' options), then failed
    mid-run with a TypeError; a constructor without `model` failed so too; Annotated ranges
    were dropped (spare=9 ran) and a float option took nan."""
    from kvbench.schema import check_plugin_options

    with pytest.raises(UserError, match=r"no option 'placement' \(it accepts: block_size, spare\)"):
        check_plugin_options("allocator", NoKeywords, {"placement": "first_fit"})
    assert check_plugin_options("allocator", NoKeywords, {"spare": 1}) == {"spare": 1}
    with pytest.raises(UserError, match="allocator no_model's constructor takes no model: kvbench builds"):
        check_plugin_options("allocator", NoModel, {})
    assert check_plugin_options("allocator", Ranged, {"spare": 8, "slack": 0.5}) == {"spare": 8, "slack": 0.5}
    with pytest.raises(UserError, match=r"allocator.spare=9 .*8"):
        check_plugin_options("allocator", Ranged, {"spare": 9})
    with pytest.raises(UserError, match="allocator.spare='3' must be an integer"):
        check_plugin_options("allocator", Ranged, {"spare": "3"})
    with pytest.raises(UserError, match="allocator.slack=nan is not allowed: a float option is a finite number"):
        check_plugin_options("allocator", Ranged, {"slack": float("nan")})


def test_a_backend_is_built_with_its_options(monkeypatch):
    """backend.note=x was checked against the constructor and recorded, then the backend was
    built with no arguments at all."""
    from kvbench.plugins.backends.eager import EagerBackend
    from kvbench.scenarios import build

    built = []

    class Noted(EagerBackend):
        name = "noted"

        def __init__(self, note: str = "default"):
            built.append(note)

    module = plugin_module(Noted, hook="kvbench_backends")
    registry = default_registry()
    registry.register(module)
    try:
        with initialize_config_module("kvbench.conf", version_base="1.3"):
            cfg = compose(
                "bench",
                overrides=["scenario=serve", "model=tiny", "+backend.name=noted", "+backend.note=given"]
                + ["workload.num_requests=2", "progress=false", "plots=false"],
            )
        assert build.backend_options(cfg) == {"note": "given"}
        (row,) = run_point(cfg)
        assert row["backend"] == "noted" and set(built) == {"given"}
    finally:
        registry.unregister(module)


def test_an_installed_plugin_without_a_config_file_is_named_installed_with_the_way_to_choose_it(tmp_path, monkeypatch):
    """`+allocator=spare` for an installed package that ships no conf/allocator/spare.yaml read
    'unknown allocator', as if nothing were installed."""
    from kvbench import cli

    from helpers.cli import refused

    monkeypatch.chdir(tmp_path)
    registry = default_registry()
    module = plugin_module(Spare)
    registry.register(module)
    try:
        said = refused(lambda: cli.main(["+allocator=spare", "workload.num_requests=5", "progress=false"]))
    finally:
        registry.unregister(module)
    assert said.startswith("error: allocator 'spare' is installed, but no allocator/spare.yaml is on the config search")
    assert "+allocator.name=spare" in said


def test_a_misspelt_hook_and_an_allocator_without_the_reader_of_its_layout_are_refused():
    """A `kvbench_allocator` hook (one letter short) was ignored: 'unknown allocator'; a paged
    allocator without block_table(seq) ran its simulation and died in serve: AttributeError."""
    registry = Registry(load_entry_points=False)
    registry.register(plugin_module(HalfOracleAllocator, hook="kvbench_allocator"), name="typo_kv")
    with pytest.raises(
        UserError, match="the kvbench plugin typo_kv defines a hook kvbench has not .*kvbench_allocator"
    ):
        registry.check_hooks()

    class Tableless(HalfOracleAllocator):
        name, layout = "tableless", "paged"

    class Shapeless(HalfOracleAllocator):
        name, layout = "shapeless", "blocks"

    registry = Registry()
    registry.register(plugin_module(Tableless, Shapeless), name="third_party_kv")
    with pytest.raises(UserError, match=r"has a paged layout but no block_table\(seq\)"):
        registry.get("allocator", "tableless")
    with pytest.raises(UserError, match="has layout 'blocks'; a layout is 'paged'"):
        registry.get("allocator", "shapeless")


def test_help_shows_an_unannotated_plugin_option_as_any_value_as_the_run_takes_it():
    """`ratio=0.5` without an annotation read "float" in the help, though the run takes any value."""
    import types

    from kvbench.hookspecs import hookimpl
    from kvbench.plugins.allocators.paged import PagedAllocator
    from kvbench.registry import default_registry
    from kvbench.schema.docs import describe, plugin_fields

    class Loose(PagedAllocator):
        name = "loose"

        def __init__(self, num_slots, max_model_len, block_size=16, ratio=0.5, limit: int = 3, **options):
            super().__init__(num_slots, max_model_len, block_size, **options)

    module = types.ModuleType("loose_plugin")
    module.kvbench_allocators = hookimpl(lambda: [Loose])
    default_registry().register(module)
    try:
        shown = {key: describe(field) for key, field in plugin_fields("allocator", "loose")}
    finally:
        default_registry().unregister(module)
    assert shown["allocator.ratio"] == "any" and shown["allocator.limit"] == "int"
