"""harness.core.terminal: what a device sends, made safe for the operator's terminal (issue 23, item 6)."""

from __future__ import annotations

import pytest

from harness.core.terminal import terminal_text


@pytest.mark.parametrize(
    ("sent", "shown"),
    [
        ("Pixel \x1b[31mred\x1b[0m 8", "Pixel red 8"),  # CSI colour
        ("a\x1b[2J\x1b[1;1Hb", "ab"),  # clear the screen, move the cursor
        ("a\x1b]0;a new title\x07b", "ab"),  # OSC window title, BEL-terminated
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC hyperlink, ST-terminated
        ("a\x9b2Jb\x9d0;t\x9cc", "abc"),  # C1 CSI and OSC
        ("ok \x1bc", "ok "),  # ESC c: reset the terminal
        ("trailing \x1b", "trailing "),
        ("c\x07\x08\x7f\x00\x0ed", "cd"),  # BEL, backspace, DEL, NUL, shift-out
        ("x\u202eevil\u202c \u2066iso\u2069", "xevil iso"),  # bidi override and isolate
        ("line 1\nline 2\r\tz\u2028w", "line 1 line 2  z w"),  # one line, words kept apart
        ("é ü 中文 RTX 4090", "é ü 中文 RTX 4090"),  # printable text is left alone
    ],
)
def test_control_characters_and_escape_sequences_are_stripped(sent: str, shown: str) -> None:
    assert terminal_text(sent) == shown
