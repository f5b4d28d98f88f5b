"""The one error a run specification raises: it names the field, so every caller can point at it."""


class SpecError(ValueError):
    """A spec that cannot be run. The message names the field and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
