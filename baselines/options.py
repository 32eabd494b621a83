"""Parsing the built-in strategies' options (``--set NAME.OPTION=VALUE``)."""

from specterbench.errors import UsageError

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def flag(strategy: str, option: str, value) -> bool:
    """A true/false option: a bool, or one of the words of :data:`TRUE` / :data:`FALSE`; anything else is a one-line
    UsageError naming the strategy, the option and the value."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE + FALSE:
        return text in TRUE
    raise UsageError(f"{strategy} option {option}={value!r} is invalid: use true or false")
