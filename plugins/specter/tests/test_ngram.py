"""spec-ngram: the lookup proposes what followed the latest earlier occurrence of the longest matching suffix, holds
no device bytes, and the verified output is the target's own under greedy and sampled decoding."""

import pytest

from specterbench.bench.budget import parse_budget
from specterbench.bench.config import BenchConfig
from specterbench.bench.runner import Runner
from specterbench.engine.sampling import GREEDY, DecodeSetting
from specterbench.errors import UsageError
from specterbench.runfiles.results import read_rows
from specterbench_specter.lookup import NgramIndex, SpecNgram


def test_the_longest_suffix_with_an_earlier_occurrence_proposes_what_followed_it():
    index = NgramIndex(range(1, 4))
    seq = [5, 6, 7, 1, 2, 5, 6, 7]
    assert index.lookup(seq, 3) == [1, 2, 5]  # the 3-gram 5 6 7 occurred at 0, followed by 1 2 5
    seq += [9]
    assert index.lookup(seq, 3) == []  # 9 never occurred before
    seq += [5, 6]
    assert index.lookup(seq, 2) == [7, 9]  # 9 5 6 is new; 5 6 was last seen at 5, followed by 7 9


def test_the_latest_occurrence_wins_and_short_matches_respect_the_minimum():
    index = NgramIndex(range(2, 3))
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    assert index.lookup(seq, 1) == [4]  # 1 2 last seen at 3, followed by 4
    assert NgramIndex(range(2, 3)).lookup([1, 3, 1], 4) == []  # a 1-gram match is below ngram_min=2


def test_a_lookup_never_matches_the_suffix_itself():
    assert NgramIndex(range(1, 3)).lookup([4, 4], 3) == [4]  # the first 4 is followed by the second
    assert NgramIndex(range(1, 3)).lookup([4], 3) == []


@pytest.mark.parametrize("options, message", [
    ({"k": 0}, "option k=0 is invalid"),
    ({"k": "abc"}, "option k='abc' is invalid"),
    ({"ngram_min": 3, "ngram_max": 2}, "ngram_min=3, ngram_max=2 are invalid"),
    ({"ngram_max": 99}, "ngram_max <= 8"),
    ({"host": "yes"}, "option host='yes' is invalid"),
    ({"bits": 4}, "has no option(s) bits"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SpecNgram.validate_options(options)


@pytest.mark.parametrize("decode", [GREEDY, DecodeSetting("sample", temperature=1.0)], ids=["greedy", "sampled"])
def test_the_output_is_the_targets_and_no_draft_bytes_are_held(host, small_prompts, tmp_path, decode):
    config = BenchConfig(models=("tiny-random-mixtral",), strategies=("spec-ngram",), budgets=(parse_budget("50%"),),
                         profile="a100-40g-pcie4", tokens=24, prompts=2, decode=decode)
    Runner(host, config, tmp_path).run()
    (row,) = read_rows(tmp_path)
    assert row.status == "ok" and row.lossless, row.error
    m = row.extra
    assert m["draft_device_bytes"] == 0 and m["draft"] == "n-gram lookup"
    assert 0 <= m["lookup_match_rate"] <= 1 and "acceptance_by_position" in m
    assert sum(m["k_hist"].values()) > 0
