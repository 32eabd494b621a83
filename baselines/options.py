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


PREFILL_CHOICES = ("fetch", "priced")


def prefill_option(strategy: str, options: dict) -> str:
    """A cache strategy's ``prefill``: ``fetch`` (every miss of a prompt copied, the default) or ``priced`` (each
    MoE layer placed by the engine's prefill rule); anything else is a one-line UsageError."""
    value = str(options.get("prefill", "fetch")).strip().lower()
    if value not in PREFILL_CHOICES:
        raise UsageError(f"{strategy} option prefill={options.get('prefill')!r} is invalid: use fetch or priced")
    return value
