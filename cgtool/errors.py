"""The one error type the library raises; the CLI turns it into a message and exit code 2."""


class CgtoolError(Exception):
    """A problem the user can fix: what went wrong, and what to do about it."""

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        if not self.remedy:
            return self.message
        return f"{self.message.rstrip('.')}. {self.remedy}"


class ConfigError(CgtoolError):
    """A model config or weights folder cannot be used."""


class InputError(CgtoolError):
    """A trace, report or plan file is malformed."""


class EnvironmentProblem(CgtoolError):
    """The machine cannot do what was asked (no GPU, too little memory)."""


def shown_integer(value: int) -> str:
    """An integer for an error message: in full with thousands separators, or, past 30 digits
    (JSON integers have no bound), only how many digits it has."""
    digits = len(str(abs(value)))
    return f"{value:,}" if digits <= 30 else f"an integer of {digits} digits"
