"""Sweeps defined next to `get_config` in `configs/*.py`, run locally (`rlax-post sweep`) or by XManager
(`launch/launch_xm.py`); docs/launch.md."""

from rlax_post.sweep._compare import compare_report
from rlax_post.sweep._compare import compare_runs
from rlax_post.sweep._compare import differing_settings
from rlax_post.sweep._local import contrasts
from rlax_post.sweep._local import finished
from rlax_post.sweep._local import group_figures
from rlax_post.sweep._local import LocalSweep
from rlax_post.sweep._local import plan_local
from rlax_post.sweep._local import plot
from rlax_post.sweep._local import run_local
from rlax_post.sweep._local import run_plan
from rlax_post.sweep._local import table
from rlax_post.sweep._local import UnitResult
from rlax_post.sweep._local import WARM_CACHE
from rlax_post.sweep._local import write_report
from rlax_post.sweep._units import apply
from rlax_post.sweep._units import axis
from rlax_post.sweep._units import check_overrides
from rlax_post.sweep._units import check_value
from rlax_post.sweep._units import command_line_overrides
from rlax_post.sweep._units import config_of
from rlax_post.sweep._units import defines_sweep
from rlax_post.sweep._units import differences
from rlax_post.sweep._units import load_module
from rlax_post.sweep._units import none_overrides
from rlax_post.sweep._units import one_of
from rlax_post.sweep._units import product
from rlax_post.sweep._units import root_name
from rlax_post.sweep._units import work_units
from rlax_post.sweep._units import WorkUnit
from rlax_post.sweep._units import variants
from rlax_post.sweep._units import unit_environment
from rlax_post.sweep._units import wandb_group
from rlax_post.sweep._units import zipped

__all__ = [
    "apply",
    "axis",
    "check_overrides",
    "check_value",
    "command_line_overrides",
    "compare_report",
    "compare_runs",
    "config_of",
    "defines_sweep",
    "contrasts",
    "differences",
    "differing_settings",
    "finished",
    "group_figures",
    "load_module",
    "LocalSweep",
    "none_overrides",
    "one_of",
    "plan_local",
    "plot",
    "product",
    "root_name",
    "run_local",
    "run_plan",
    "table",
    "UnitResult",
    "WARM_CACHE",
    "work_units",
    "WorkUnit",
    "write_report",
    "variants",
    "unit_environment",
    "wandb_group",
    "zipped",
]
