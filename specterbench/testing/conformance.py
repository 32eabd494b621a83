"""Strategy conformance battery: a pytest plugin shipped with specterbench.

Run it from any directory against any installed strategy::

    pytest --specterbench-strategy=lfu            # one strategy
    pytest --specterbench-strategy=lru,oracle     # several (or repeat the option)
    pytest --specterbench-strategy=all            # every registered strategy

The tests below are added to whatever else pytest collects, once per strategy. Each drives the strategy through
the real :class:`~specterbench.bench.runner.Runner` on the embedded ``tiny-random-*`` models (modeled clock, a few
short prompts) with a :class:`~specterbench.testing.lab.Watch` on it, and checks one rule:

- the strategy reports a name and a version of its own;
- the expert cache never holds more than the budget (at a low budget; the test is skipped, with the reason,
  only when the strategy refuses every low budget when it is configured);
- no expert in use is evicted: neither the one being computed nor, from ``before_layer``, ``on_miss``,
  ``place_miss`` or ``substitute``, one the running layer is routed to (it has not computed yet);
- tokens are lossless on every supported family (a strategy with ``lossless = False`` must report agreement);
- two runs with the same seed give identical tokens and identical modeled samples;
- an empty prompt is refused with a clean ``UsageError``; one-token and maximum-length prompts are survived;
- a batch of 4 (``--batch 4``) decodes losslessly within the budget less the requests' KV, every request its own
  tokens, with no expert in use evicted — or, for a strategy that declares a smaller ``max_batch``, its row says
  so (status ``unsupported``);
- state resets between requests: the same request decoded after others gives the same tokens (the measured 'a',
  decoded after the warm-up request, repeats the reference's clean-state 'a'; under greedy also 'a-again', a
  different request of the same prompt).

A strategy runs at ``fixed_budget_fraction`` when it sets one, else at 75% of expert bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specterbench.catalog.tiny import TINY_FAMILIES
from specterbench.errors import SpecterbenchError, UsageError
from specterbench.plugins.host import PluginHost
from specterbench.strategy import Strategy
from specterbench.testing.lab import MODEL, PROMPT_A, PROMPTS, SEED, TOKENS, Lab, Trial

OPTION = "--specterbench-strategy"
BATTERY = "specterbench-conformance-battery"
LOW_BUDGETS = (0.35, 0.5)  # budget pressure: many evictions per token


# ---- the pytest plugin -----------------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("specterbench", "specterbench strategy conformance")
    group.addoption(OPTION, action="append", default=[], metavar="NAME",
                    help="run the strategy conformance battery against NAME (comma-separated or repeated; "
                         "'all' = every registered strategy)")


def pytest_configure(config):
    requested = [n.strip() for value in config.getoption(OPTION) for n in value.split(",") if n.strip()]
    if not requested or config.pluginmanager.has_plugin(BATTERY):
        return

    host = PluginHost()  # the plugins `specterbench run` would load, independent of tests' `host` fixture
    try:
        registry = host.strategies()
        names = registry.names() if "all" in requested else [registry.entry(n).name for n in dict.fromkeys(requested)]
    except SpecterbenchError as err:
        raise pytest.UsageError(f"{OPTION}: {err}") from None
    if not names:
        raise pytest.UsageError(f"{OPTION}=all: no strategy is registered")
    config.pluginmanager.register(_Battery(host, names), BATTERY)
    here = Path(__file__).resolve()
    if not any(Path(arg.split("::")[0]).resolve() == here for arg in config.args):
        config.args.append(str(here))


class _Battery:
    """Parametrizes this module's tests by the selected strategies (and families), once per pytest session."""

    def __init__(self, host, names):
        self.host, self.names = host, names

    def pytest_generate_tests(self, metafunc):
        if Path(metafunc.module.__file__).resolve() != Path(__file__).resolve():
            return
        if "specterbench_strategy" in metafunc.fixturenames:
            metafunc.parametrize("specterbench_strategy", self.names)
        if "specterbench_family" in metafunc.fixturenames:

            metafunc.parametrize("specterbench_family", TINY_FAMILIES)


@pytest.fixture
def specterbench_strategy():
    pytest.skip(f"no strategy selected: pass {OPTION}=NAME")


@pytest.fixture(scope="session")
def specterbench_lab(request, tmp_path_factory):
    battery = request.config.pluginmanager.get_plugin(BATTERY)
    if battery is None:
        pytest.skip(f"no strategy selected: pass {OPTION}=NAME")
    return Lab(battery.host, tmp_path_factory.mktemp("conformance"))


# ---- reading a run: each failure names the rule it broke -----------------------------------------------

def _describe(row) -> str:
    return f"{row.strategy} on {row.model} at {row.budget_fraction:.0%}"


def _ok_rows(trial: Trial, rule: str | None = None):
    """Rows of cells that ran (not refused at configure). Fails the test on a watch violation of ``rule`` first,
    then on any error row, so a failure names the rule broken rather than a symptom."""
    if trial.error is not None:
        pytest.fail(f"the run failed outside any cell: {type(trial.error).__name__}: {trial.error}")
    rows = [r for r in trial.rows if r.budget_bytes not in trial.refusals]
    for row in rows:
        watch = trial.watches.get(row.budget_bytes)
        if rule and watch is not None and watch.violations[rule]:
            pytest.fail(f"{_describe(row)}: " + "; ".join(watch.violations[rule][:3]))
    for row in rows:
        if row.status == "error":
            pytest.fail(f"{_describe(row)} failed: {row.error}\n{row.extra.get('traceback', '')}")
    return rows


def _standard(lab: Lab, name: str, **kw) -> Trial:
    trial = lab.run(name, **kw)
    refused = [r for r in trial.rows if r.budget_bytes in trial.refusals]
    if refused:
        pytest.fail(f"strategy {name!r} refused {refused[0].budget_fraction:.0%} of expert bytes on "
                    f"{refused[0].model}; every strategy must work there: {trial.refusals[refused[0].budget_bytes]}")
    return trial


# ---- the battery ---------------------------------------------------------------------------------------

def test_reports_a_name_and_a_version(specterbench_strategy, specterbench_lab):

    cls = specterbench_lab.strategy_class(specterbench_strategy)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        pytest.fail(f"{specterbench_strategy!r} registered {cls!r}, not a specterbench.Strategy subclass")
    if not isinstance(cls.name, str) or not cls.name:
        pytest.fail(f"{cls.__name__}.name must be a non-empty string")
    own = next((c for c in cls.__mro__ if "version" in vars(c)), Strategy)
    if own is Strategy or not isinstance(cls.version, str) or not cls.version.strip():
        pytest.fail(f"{cls.__name__} must set its own `version` (a non-empty string, recorded in every row); "
                    f"it reports {cls.version!r} from {own.__name__}")
    if not isinstance(cls.lossless, bool):
        pytest.fail(f"{cls.__name__}.lossless must be True or False, got {cls.lossless!r}")
    if cls.fixed_budget_fraction is not None and not 0 < cls.fixed_budget_fraction <= 1:
        pytest.fail(f"{cls.__name__}.fixed_budget_fraction must be in (0, 1], got {cls.fixed_budget_fraction}")


def test_budget_is_never_exceeded(specterbench_strategy, specterbench_lab):
    trial = specterbench_lab.run(specterbench_strategy, budgets=LOW_BUDGETS)
    checked = [(trial, row) for row in _ok_rows(trial, "budget")]
    if not checked:
        reasons = "; ".join(sorted(set(trial.refusals.values())))
        pytest.skip(f"{specterbench_strategy} refuses every low budget "
                    f"({', '.join(f'{b:.0%}' for b in LOW_BUDGETS)}): {reasons}")
    standard = _standard(specterbench_lab, specterbench_strategy)
    checked += [(standard, row) for row in _ok_rows(standard, "budget")]
    for t, row in checked:
        watch = t.watches[row.budget_bytes]
        peak = max(watch.peak_bytes, row.peak_cache_bytes or 0)
        # the budget less the strategy's device bytes, or more once it gave some back (a dropped draft)
        cache_bytes = max(row.budget_bytes - row.strategy_device_bytes, watch.allowed)
        if peak > cache_bytes:
            pytest.fail(f"{_describe(row)}: the cache peaked at {peak} bytes; the budget leaves {cache_bytes} "
                        f"after {row.strategy_device_bytes} device bytes")


def test_no_expert_in_use_is_evicted(specterbench_strategy, specterbench_lab):
    for trial in (specterbench_lab.run(specterbench_strategy, budgets=LOW_BUDGETS),
                  _standard(specterbench_lab, specterbench_strategy)):
        _ok_rows(trial, "in use")


def test_tokens_are_lossless_on_every_family(specterbench_strategy, specterbench_family, specterbench_lab):
    model = f"tiny-random-{specterbench_family.replace('_', '-')}"
    trial = _standard(specterbench_lab, specterbench_strategy, model=model)
    for row in _ok_rows(trial):
        if row.lossless_strategy:
            if row.status != "ok" or not row.lossless:
                pytest.fail(f"{_describe(row)} is not lossless: {row.error or row.first_divergence}")
        elif row.token_agreement is None:
            pytest.fail(f"{_describe(row)} is lossy but reports no token agreement")


def test_runs_are_deterministic_with_a_seed(specterbench_strategy, specterbench_lab):
    first = _standard(specterbench_lab, specterbench_strategy)
    second = _standard(specterbench_lab, specterbench_strategy, tag="again")
    (a,), (b,) = _ok_rows(first), _ok_rows(second)
    n = len(PROMPTS)
    tokens_a = first.watches[a.budget_bytes].outputs[-n:]
    tokens_b = second.watches[b.budget_bytes].outputs[-n:]
    if tokens_a != tokens_b:
        pytest.fail(f"{_describe(a)}: two runs with seed {SEED} gave different tokens: {tokens_a} != {tokens_b}")
    for name in ("tpot_ms", "ttft_ms"):
        if a.samples[name] != b.samples[name]:
            pytest.fail(f"{_describe(a)}: two runs with seed {SEED} gave different modeled {name} samples")
    for name in ("hits", "misses", "h2d_bytes", "prefetch_issued", "peak_cache_bytes"):
        if getattr(a, name) != getattr(b, name):
            pytest.fail(f"{_describe(a)}: two runs with seed {SEED} gave {name} {getattr(a, name)} and "
                        f"{getattr(b, name)}")


def test_an_empty_prompt_is_refused_cleanly(specterbench_strategy, specterbench_lab):

    trial = specterbench_lab.run(specterbench_strategy, prompts=(("empty", ""),))
    if not isinstance(trial.error, UsageError) or trial.rows:
        got = f"{type(trial.error).__name__}: {trial.error}" if trial.error else f"{len(trial.rows)} row(s)"
        pytest.fail(f"an empty prompt must be refused with UsageError before the strategy runs; got {got}")


def test_survives_a_one_token_prompt(specterbench_strategy, specterbench_lab):
    trial = _standard(specterbench_lab, specterbench_strategy, prompts=(("one-token", "Q"),))
    for row in _ok_rows(trial):
        if row.status != "ok":
            pytest.fail(f"{_describe(row)} with a one-token prompt: {row.error}")


def test_survives_a_maximum_length_prompt(specterbench_strategy, specterbench_lab):
    model, tokenizer = specterbench_lab.host.models().get(MODEL).load()
    n = model.config.max_position_embeddings - TOKENS
    text = (PROMPT_A + " ") * (n // len(PROMPT_A) + 2)
    if len(tokenizer.encode(text)) < n:  # pragma: no cover - the embedded tiny models encode bytes
        pytest.fail(f"could not build a {n}-token prompt for {MODEL}")
    trial = _standard(specterbench_lab, specterbench_strategy, prompts=(("max-length", text),),
                      max_prompt_tokens=n)
    for row in _ok_rows(trial):
        if row.status != "ok":
            pytest.fail(f"{_describe(row)} with a {n}-token prompt: {row.error}")


def test_state_resets_between_requests(specterbench_strategy, specterbench_lab):
    trial = _standard(specterbench_lab, specterbench_strategy)
    (row,) = _ok_rows(trial)
    outputs = dict(trial.watches[row.budget_bytes].outputs[-len(PROMPTS):])
    short = {pid: len(toks) for pid, toks in outputs.items() if len(toks) != TOKENS}
    if short:
        pytest.fail(f"{_describe(row)}: requests must each give {TOKENS} tokens; got {short}")
    if not row.lossless_strategy:
        return
    # The reference decoded prompt 'a' from a clean state; the measured 'a' comes after the runner's warm-up request
    # (a calibration prompt) and must repeat it. Under greedy, 'a-again' (another request) must as well; under
    # sampling it has its own noise, so its tokens may differ.
    pairs = []  # (what was decoded again, its tokens, the tokens it must repeat)
    if trial.reference is not None and "a" in trial.reference.tokens:
        pairs.append(("prompt 'a' decoded after the warm-up", outputs["a"], trial.reference.tokens["a"]))
    if row.decode.get("mode", "greedy") == "greedy":
        pairs.append(("prompt 'a' decoded again after 'b'", outputs["a-again"], outputs["a"]))
    for what, again, first in pairs:
        if again != first:
            pytest.fail(f"{_describe(row)}: {what} gave {list(again)}, first {list(first)}; reset per-request state "
                        f"in on_request_start()")


BATCH = 4
BATCH_PROMPTS = (*PROMPTS, ("c", "Once more unto the breach, dear friends, once more; or close the wall up"))


def test_a_batch_of_4_is_lossless_or_says_why(specterbench_strategy, specterbench_lab):
    cls = specterbench_lab.strategy_class(specterbench_strategy)
    trial = specterbench_lab.run(specterbench_strategy, prompts=BATCH_PROMPTS, batch=BATCH)
    if trial.error is not None:
        pytest.fail(f"the batch run failed outside any cell: {type(trial.error).__name__}: {trial.error}")
    if cls.max_batch is not None and cls.max_batch < BATCH:
        for row in trial.rows:
            if row.status != "unsupported" or f"at most {cls.max_batch}" not in (row.error or ""):
                pytest.fail(f"{_describe(row)}: max_batch {cls.max_batch} < {BATCH} must give an 'unsupported' row "
                            f"saying so; got {row.status}: {row.error}")
        return
    for watch in trial.watches.values():
        for rule in ("budget", "in use"):
            if watch.violations[rule]:
                pytest.fail(f"{specterbench_strategy} at batch {BATCH}: " + "; ".join(watch.violations[rule][:3]))
    for row in trial.rows:
        if row.status == "error":
            pytest.fail(f"{_describe(row)} at batch {BATCH} failed: {row.error}\n{row.extra.get('traceback', '')}")
        if row.batch != BATCH:
            pytest.fail(f"{_describe(row)}: the row says batch {row.batch}, the cell ran {BATCH}")
        if row.lossless_strategy and (row.status != "ok" or not row.lossless):
            pytest.fail(f"{_describe(row)} is not lossless at batch {BATCH}: {row.error or row.first_divergence}")
        kv = row.extra.get("kv_bytes", 0)
        watch = trial.watches.get(row.budget_bytes - kv)  # or more once the strategy gave bytes back (a dropped draft)
        room = max(row.budget_bytes - kv - row.strategy_device_bytes, watch.allowed if watch is not None else 0)
        if row.peak_cache_bytes > room:
            pytest.fail(f"{_describe(row)} at batch {BATCH}: the cache peaked at {row.peak_cache_bytes} bytes, over "
                        f"the budget less {kv} bytes of the requests' KV")
