"""Hook specifications: everything a plugin can tell specterbench or hear from it.

Write a plugin as a module (or object) with functions named like these specs, decorated with
``from specterbench import hookimpl``, and declare it in your package's ``pyproject.toml``::

    [project.entry-points.specterbench]
    my_plugin = "my_package.plugin"

Hooks only register things and observe the run's lifecycle. Per-layer and per-token decisions go straight to
the :class:`specterbench.Strategy` object a plugin registers, never through these hooks. All hooks are called
with keyword arguments; every implementation is called (no first-result-wins hooks) unless a spec says so.
"""

import pluggy

hookspec = pluggy.HookspecMarker("specterbench")

# ---- registration ------------------------------------------------------------------------------------


@hookspec
def specterbench_register_strategies(register):
    """Register offload strategies.

    Called once, when the plugin host first needs the strategy registry.

    :param register: call ``register(cls)`` with a :class:`specterbench.Strategy` subclass whose ``name`` is
        unique; a duplicate name is refused with the name of the plugin that registered it first.
    :return: ignored.
    """


@hookspec
def specterbench_register_models(register):
    """Register models that ``--model NAME`` resolves.

    Called once, when the plugin host first needs the model registry.

    :param register: call ``register(spec)`` with a :class:`specterbench.catalog.models.ModelSpec` whose ``load()``
        returns ``(model, tokenizer)`` from local files only (nothing may download at run time).
    :return: ignored.
    """


@hookspec
def specterbench_register_profiles(register):
    """Register hardware profiles for the modeled clock.

    Called once, when the plugin host first needs the profile registry.

    :param register: call ``register(profile)`` with a :class:`specterbench.engine.profiles.HardwareProfile`; every
        figure in it should cite its source in ``sources``.
    :return: ignored.
    """


@hookspec
def specterbench_register_host_profiles(register):
    """Register host CPU profiles, for strategies that compute experts on the host (``cpu-experts``).

    Called once, when the plugin host first needs the host-profile registry.

    :param register: call ``register(profile)`` with a :class:`specterbench.engine.profiles.HostProfile` that cites
        its sources.
    :return: ignored.
    """


# ---- run lifecycle -----------------------------------------------------------------------------------


@hookspec
def specterbench_run_start(run_dir, config):
    """A benchmark run is about to start.

    :param run_dir: ``pathlib.Path`` of the run's output folder (``rows.jsonl`` is appended there).
    :param config: what the run covers: the :class:`specterbench.bench.config.BenchConfig` of ``specterbench run``
        (models, strategies, budgets, profile, clock, workload, tokens, repeats, seed), or the
        :class:`specterbench.bench.sweep.Grid` of ``specterbench sweep``.
    :return: ignored.
    """


@hookspec
def specterbench_row_written(row):
    """A result row was appended (and fsynced) to ``rows.jsonl``; it may be an error row.

    :param row: the :class:`specterbench.runfiles.results.ResultRow`.
    :return: ignored.
    """


@hookspec
def specterbench_run_end(run_dir, rows):
    """A benchmark run finished (also after Ctrl-C, with the rows finished so far).

    :param run_dir: ``pathlib.Path`` of the run's output folder.
    :param rows: list of :class:`specterbench.runfiles.results.ResultRow` written by this invocation.
    :return: ignored.
    """


# ---- measurement -------------------------------------------------------------------------------------


@hookspec
def specterbench_cell_start(cell, engine):
    """A benchmark cell (one strategy at one budget on one model) is about to decode its measured requests.

    Called after the warm-up request, right before the first measured one; start samplers here.

    :param cell: the cell's key (``str``), equal to ``ResultRow.cell`` of the row it will produce.
    :param engine: the :class:`specterbench.engine.engine.Engine` (its ``device`` tells where it runs).
    :return: ignored.
    """


@hookspec
def specterbench_cell_end(cell, row):
    """The cell's measured requests are done (or failed); its row is about to be written.

    Stop samplers here and fill measurement fields of the row (for example ``nvml_h2d_bytes`` and
    ``nvml_note``). Called for error rows too.

    :param cell: the cell's key (``str``).
    :param row: the :class:`specterbench.runfiles.results.ResultRow`, mutable until this hook returns.
    :return: ignored.
    """



@hookspec
def specterbench_environment():
    """Contribute environment metadata recorded with every run (GPU, driver, link, library versions).

    Called once per run.

    :return: a ``dict`` of JSON-serialisable values, merged into the run's environment; later plugins cannot
        overwrite keys set earlier (a clash is reported in the environment under ``conflicts``).
    """
