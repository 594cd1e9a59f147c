"""Concerto: schedule and simulate distributed deep-learning training programs.

The package wraps the C++ library (``concerto._concerto``): programs of the
IR, the frontends' model presets, every scheduler (the baselines and
concerto), the simulator and the autodiff pass. Reports are the dicts the CLI
prints with ``--json``; a failing call raises :class:`concerto.Error` with
the library's message. docs/python.md has examples.

    >>> import concerto
    >>> p = concerto.lower("gpt-tiny", "dp=2,tp=2")
    >>> r = concerto.simulate(p, cluster="a800-4x8", scheduler="concerto")
    >>> r["makespan_us"] > 0
    True
"""

from ._concerto import (  # noqa: F401
    Error,
    Program,
    __version__,
    clusters,
    collective_groups,
    profile_signatures,
    compare,
    differentiate,
    execute,
    global_indices,
    lower,
    models,
    op_types,
    options,
    parse_program,
    partition,
    plan,
    rank_inputs,
    rank_layout,
    read_program,
    schedule,
    schedulers,
    simulate,
    verify_schedule,
)

__all__ = [
    "Error",
    "Program",
    "__version__",
    "clusters",
    "collective_groups",
    "profile_signatures",
    "compare",
    "differentiate",
    "execute",
    "global_indices",
    "lower",
    "models",
    "op_types",
    "options",
    "parse_program",
    "partition",
    "plan",
    "rank_inputs",
    "rank_layout",
    "read_program",
    "schedule",
    "schedulers",
    "simulate",
    "verify_schedule",
]
