"""Text from outside this machine (a served device's model name, GPU description, error message, the
Host header it sent) made safe for the operator's terminal: one line, no control characters. An escape
sequence could recolour the terminal, move the cursor and rewrite earlier lines, set the window title
or hide text; a bidi override reorders what follows it. The store keeps the text as it came."""

from __future__ import annotations

import re
import unicodedata

# Whole sequences first, so no parameter bytes are left behind as text: CSI (ESC [ or 0x9b … final
# byte), OSC/DCS/APC/PM/SOS strings (… up to BEL or ST), then any other ESC with its one character.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d-\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b.?",
    re.DOTALL,
)
# C0 and C1 controls, DEL (Cc); bidi overrides and isolates, zero-width and other format characters
# (Cf); lone surrogates (Cs); line and paragraph separators (Zl, Zp).
_UNPRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")
_BREAKS = "\t\n\r\v\f\x85\u2028\u2029"  # where the text had a break, a space keeps its words apart


def terminal_text(text: str) -> str:
    """`text` without terminal escapes and control characters, on one line."""
    kept = []
    for char in _SEQUENCES.sub("", text):
        if char in _BREAKS:
            kept.append(" ")
        elif unicodedata.category(char) not in _UNPRINTABLE:
            kept.append(char)
    return "".join(kept)


def terminal_lines(text: str) -> str:
    """`text` made safe line by line (terminal_text), its own line breaks kept: a rendered table or
    report whose lines hold stored text."""
    return "\n".join(terminal_text(line) for line in text.split("\n"))


def quoted_text(value: object, limit: int = 60) -> str:
    """Text from elsewhere as a message quotes it: one clean line (terminal_text), at most `limit`
    characters (then …), in quotes; NULL for None."""
    if value is None:
        return "NULL"
    text = terminal_text(str(value))
    return repr(text[:limit] + ("…" if len(text) > limit else ""))
