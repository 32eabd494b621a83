"""Registration checks (specterbench.plugins.checks): a strategy the engine would call wrongly, or never, is refused
when its plugin registers it, in one line naming the class, the method or attribute and the fix."""

import pytest

from specterbench import Strategy, hookimpl
from specterbench.errors import PluginError, UsageError
from specterbench.plugins.checks import check_strategy, contract_attributes, decision_points


def refusal(cls) -> str:
    with pytest.raises(PluginError) as info:
        check_strategy(cls, "my-plugin")
    message = str(info.value)
    assert "\n" not in message and "plugin 'my-plugin'" in message
    return message


def test_a_misspelled_decision_point_names_the_class_method_and_the_closest_signature():
    class Typo(Strategy):
        name = "typo"
        version = "1"

        def choose_victm(self, candidates, needed):
            return candidates[-1]

    message = refusal(Typo)
    assert "Typo.choose_victm is not a decision point" in message
    assert "did you mean choose_victim(self, candidates, needed)?" in message


def test_the_closest_name_comes_with_its_signature_without_annotations():
    class Typo(Strategy):
        name = "typo"
        version = "1"

        def before_layr(self, layer, experts, tokens_per_expert):
            pass

    assert "did you mean before_layer(self, layer, experts, tokens_per_expert)?" in refusal(Typo)


def test_a_decision_point_that_cannot_take_the_engines_arguments_shows_how_it_is_called():
    class TooFew(Strategy):
        name = "too-few"
        version = "1"

        def before_layer(self, layer):
            pass

    message = refusal(TooFew)
    assert "TooFew.before_layer(self, layer) cannot take the decision point's arguments" in message
    assert "the engine calls before_layer(self, layer, experts, tokens_per_expert)" in message


def test_an_extra_required_argument_is_refused_and_an_optional_one_is_not():
    class Extra(Strategy):
        name = "extra"
        version = "1"

        def after_layer(self, layer, experts, stats):
            pass

    assert "Extra.after_layer(self, layer, experts, stats) cannot take" in refusal(Extra)

    class Optional(Strategy):
        name = "optional"
        version = "1"

        def after_layer(self, layer, experts, stats=None):
            pass

    check_strategy(Optional, "my-plugin")


def test_prepare_must_accept_the_calibration_argument():
    class NoCalibration(Strategy):
        name = "no-calibration"
        version = "1"

        def prepare(self, engine):
            pass

    assert "the engine calls prepare(self, engine, calibration=None)" in refusal(NoCalibration)


def test_a_prepare_written_for_calibration_counts_says_what_changed():
    class Old(Strategy):
        name = "old"
        version = "1"
        uses_calibration = True

        def prepare(self, engine, calibration_counts=None):
            self.hot = calibration_counts.sum(0)

    message = refusal(Old)
    assert "Old.prepare(self, engine, calibration_counts=None) is written against an older contract" in message
    assert "calibration.counts" in message


def test_a_misspelled_contract_attribute_is_refused_with_its_default():
    class Lossy(Strategy):
        name = "lossy"
        version = "1"
        losless = False

    assert "Lossy.losless is not a Strategy attribute and would be ignored; did you mean lossless (default True)?" \
        in refusal(Lossy)


def test_a_flag_of_the_wrong_type_is_refused():
    class Stringly(Strategy):
        name = "stringly"
        version = "1"
        lossless = "no"

    assert "Stringly.lossless = 'no' must be True or False" in refusal(Stringly)

    class Fraction(Strategy):
        name = "fraction"
        version = "1"
        fixed_budget_fraction = 50

    assert "must be None or a fraction of expert bytes in (0, 1]" in refusal(Fraction)


def test_a_decision_point_that_is_not_a_method_is_refused():
    class Disabled(Strategy):
        name = "disabled"
        version = "1"
        on_miss = None

    assert "Disabled.on_miss is NoneType, not a method; the engine calls on_miss(self, key" in refusal(Disabled)


def test_a_class_without_a_name_or_not_a_strategy_is_refused():
    class Nameless(Strategy):
        pass

    assert "Nameless has no name" in refusal(Nameless)

    class NotAStrategy:
        name = "plain"

    assert "which is not a specterbench.Strategy subclass" in refusal(NotAStrategy)


def test_flexible_signatures_helpers_and_own_attributes_are_accepted():
    class Fine(Strategy):
        name = "fine"
        version = "3"
        names = ("a", "b")  # a plural of a contract attribute, not a typo of it
        window = 4

        @classmethod
        def option_names(cls):
            return ("window",)

        def before_layer(self, *args, **kwargs):
            pass

        def choose_victim(self, candidates, needed=None):
            return self._pick(candidates)

        def _pick(self, candidates):
            return candidates[0]

        def choose_k(self):  # a helper unlike any decision point
            return 2

    check_strategy(Fine, "my-plugin")


def test_inherited_classes_are_checked_but_not_the_base():
    class Base(Strategy):
        name = "base"
        version = "1"

        def on_step_ed(self, new_tokens):
            pass

    class Child(Base):
        name = "child"
        version = "1"

    assert "Base.on_step_ed is not a decision point" in refusal(Child)


def test_the_check_knows_every_decision_point_and_contract_attribute():
    assert {"before_layer", "choose_victim", "generate", "prepare", "option_names"} <= set(decision_points())
    assert contract_attributes()["lossless"] is True and "version" in contract_attributes()


def test_every_registered_strategy_passes_the_checks(host):
    for name in host.strategies().names():
        check_strategy(host.strategies().get(name), host.strategies().entry(name).plugin.name)


def test_the_host_refuses_a_misspelled_strategy_when_its_plugin_registers(host):
    class Typo(Strategy):
        name = "check-typo"
        version = "1"

        def choose_victm(self, candidates, needed):
            return candidates[0]

    class Plugin:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Typo)

    host.register(Plugin(), "typo-plugin")
    with pytest.raises(UsageError, match=r"typo-plugin.*choose_victm.*choose_victim"):
        host.strategies().entry("check-typo")


def test_a_strategy_without_a_version_of_its_own_is_refused_and_one_inherited_from_a_plugin_class_is_not():
    class Unversioned(Strategy):
        name = "unversioned"

    assert "Unversioned sets no version; set version = '1'" in refusal(Unversioned)

    class Versioned(Strategy):
        name = "versioned"
        version = "2"

    class Child(Versioned):
        name = "child"

    check_strategy(Child, "my-plugin")  # its plugin's own base says the version
