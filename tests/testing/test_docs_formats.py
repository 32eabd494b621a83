"""The examples of docs/plugins.md's "Formats" section are real: the Request, the reference trace and the
Calibration it shows are what the runner records for tiny-random-mixtral (first test prompts cut to 16 tokens,
3 new tokens, Gumbel-max sampling at T=1.0)."""

import re
from pathlib import Path

import pytest

import specterbench.bench.runner as runner_module
from specterbench import Request
from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner, encode_prompts
from specterbench.engine.sampling import DecodeSetting
from specterbench.testing.pytest_plugin import SMALL_PROMPTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def formats_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Formats\n")
    return text[start:text.index("\n## ", start + 1)]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", formats_section(), flags=re.S)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from specterbench.plugins.host import PluginHost

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner_module, "load_prompts", lambda name, n: SMALL_PROMPTS[:min(n, 2)])
        config = BenchConfig(models=("tiny-random-mixtral",), strategies=("lru",), budgets=(parse_budget("50%"),),
                             profile="a100-40g-pcie4", prompts=1, tokens=3, max_prompt_tokens=16,
                             decode=DecodeSetting.sample(temperature=1.0))
        runner = Runner(PluginHost(), config, tmp_path_factory.mktemp("formats"), env={})
        engine = runner.load_engine("tiny-random-mixtral")
        prompts = encode_prompts(engine, SMALL_PROMPTS[:1], 16)
        reference = runner.record_reference(engine, prompts)
        calibration = runner.calibrate(engine)
    return config, prompts[0], reference, calibration


def test_the_documented_request_is_the_one_the_runner_makes(recorded):
    config, (pid, ids), reference, _ = recorded
    shown = eval(python_blocks()[0], {"Request": Request, "DecodeSetting": DecodeSetting})  # noqa: S307
    assert shown.id == pid and shown.max_new_tokens == config.tokens
    assert shown.prompt_ids[:8] == ids[:8] and shown.prompt_ids[8] is Ellipsis and len(ids) == 16
    assert shown.reference_tokens == reference.tokens[pid]
    assert shown.decode == config.decode


def test_the_documented_reference_trace_is_the_recorded_one(recorded):
    _, (pid, _), reference, _ = recorded
    namespace: dict = {}
    exec(python_blocks()[1], namespace)  # noqa: S102
    assert namespace["reference_trace"] == reference.traces[pid]
    assert len(reference.traces[pid]) == 2 * 3  # num_layers × max_new_tokens, as documented


def test_the_documented_calibration_is_the_recorded_one(recorded):
    *_, calibration = recorded
    counts = re.search(r"`counts\[0\] == (\[[\d, \n]+\])`", formats_section()).group(1)
    assert tuple(calibration.counts.shape) == (2, 8) and str(calibration.counts.dtype) == "torch.int64"
    assert calibration.counts[0].tolist() == eval(counts)  # noqa: S307
    assert len(calibration.prompts) == len(calibration.sequences) == 2
    assert (sum(calibration.sequences) == calibration.counts).all()
