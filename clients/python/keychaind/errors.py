"""The one error type of the client: an OSStatus plus keychaind's one-line message."""

from __future__ import annotations

from .constants import SecCopyErrorMessageString, status_name


class KeychainError(Exception):
    """A failed keychain call. ``status`` is Apple's OSStatus (``errSecItemNotFound`` = -25300 …),
    ``message`` the daemon's one-line explanation (or the generic text for the status)."""

    def __init__(self, status: int, message: str | None = None):
        self.status = int(status)
        self.message = message or SecCopyErrorMessageString(self.status)
        super().__init__(self.status, self.message)

    @property
    def name(self) -> str:
        return status_name(self.status)

    def __str__(self) -> str:
        return f"{self.name} ({self.status}): {self.message}"

    def __repr__(self) -> str:
        return f"KeychainError({self.status}, {self.message!r})"
