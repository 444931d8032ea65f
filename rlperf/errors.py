"""Errors a user can cause. The CLI turns these into one line and exit code 2."""

from __future__ import annotations


class RlperfError(Exception):
    """An error with a message meant for the user (bad input, unusable knob, missing tool).

    ``hint`` is an optional second clause ("try ...") printed after the message.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(RlperfError, ValueError):
    """A config key, value or file that cannot be used."""


class DeviceError(RlperfError, ValueError):
    """A device that is not available here."""


class DiskError(RlperfError):
    """A write the filesystem refused (full disk, quota, read-only, no free inodes): the path, the
    bytes it needed and what was free, in one line. Exit code 2, like every error the user can fix."""


class InvalidActionError(RlperfError, ValueError):
    """An action outside the env's action space (a value, dtype or shape the env cannot take)."""


class ResetNeededError(RlperfError, RuntimeError):
    """``step`` called before the first ``reset``."""
