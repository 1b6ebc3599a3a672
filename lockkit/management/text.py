"""Text of other sessions made safe for a terminal: control characters shown as escapes, never sent raw.

A session's query, application name, user or lock target is whatever its client sent: an ``ESC [`` sequence in it
would recolour, move the cursor of, or retitle the terminal of whoever reads ``manage.py lockkit_locks``.
"""

from __future__ import annotations

import unicodedata


def printable(text: str, *, keep_newlines: bool = False) -> str:
    r"""Return ``text`` with every control and format character written as a Python escape (``\x1b``, ``\u202e``).

    Categories ``Cc`` (C0, DEL, C1: ESC, BEL, CR...) and ``Cf`` (format characters: bidirectional overrides,
    zero-width spaces) are escaped; a backslash stays as it is.

    Args:
        text: The text to show.
        keep_newlines: Leave ``\n`` as a line break (the expanded view prints a query's lines).

    Returns:
        The text, safe to write to a terminal.
    """
    out = []
    for char in text:
        if keep_newlines and char == "\n":
            out.append(char)
        elif unicodedata.category(char) in ("Cc", "Cf"):
            code = ord(char)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
        else:
            out.append(char)
    return "".join(out)


__all__ = ["printable"]
