"""The one error type a user ever sees: bad input, reported in one line with exit code 2."""


class UserError(Exception):
    """Something the person at the terminal asked for is wrong; the message says what is allowed."""

