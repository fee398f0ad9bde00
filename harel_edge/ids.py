"""The one rule every id harel_edge stores must follow: no NUL character (the libsql driver
stores such a string whole but reads it back cut at the NUL, as a different id)."""

from __future__ import annotations


def refuse_nul(value: object, what: str) -> None:
    """Raise ValueError if `value` is a string holding a NUL ("\\x00"); `what` names the argument."""
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(
            f"{what} {value!r} contains a NUL character ('\\x00'), which libSQL reads back cut short "
            "at the NUL: remove it or encode the id (for example percent-encoding or hex) before passing it"
        )
