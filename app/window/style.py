"""The window's style sheet: rows, badges, the message banner, the arena banner."""

STYLE = """
QFrame#modelRow { background: palette(base); border: 1px solid #d5d9e0; border-radius: 6px; }
QFrame#modelRow[selected="true"] { border: 2px solid #4a78c2; }
QFrame#pendingRow { background: palette(base); border: 1px dashed #b9c0cb; border-radius: 6px; }
QLabel#modelName { font-weight: 600; font-size: 11pt; }
QLabel#details, QLabel#barText, QLabel#deviceLabel, QLabel#breakdown { color: #5b6472; }
QLabel#busy { color: #1f6f3f; font-weight: 600; }
QLabel#badge { border-radius: 8px; padding: 1px 8px; font-weight: 600; font-size: 8pt;
               color: white; }
QLabel#badge[state="warm"] { background: #e4572e; }
QLabel#badge[state="cold"] { background: #4a78c2; }
QLabel#badge[state="unusable"] { background: #6b7280; }
QLabel#pinnedMark { color: #b5651d; font-size: 8pt; font-weight: 600; }
QLabel#message[kind="error"] { background: #fdecea; color: #8a1f11; border: 1px solid #f5c2bb;
                               border-radius: 4px; padding: 6px; }
QLabel#message[kind="info"] { background: #eef4fb; color: #1f3f66; border: 1px solid #c8dbf0;
                              border-radius: 4px; padding: 6px; }
QLabel#banner { background: #fff4e5; color: #7a4100; border: 1px solid #f3c98b;
                border-radius: 4px; padding: 6px; font-weight: 600; }
QLabel#arenaBanner { background: #eceff3; color: #3b4452; border: 1px solid #c7ced8;
                     border-radius: 4px; padding: 6px; font-weight: 600; }
QPlainTextEdit#details { color: #5b6472; font-family: monospace; }
QFrame#offer { background: #f3f8ee; border: 1px solid #cfe3bd; border-radius: 4px; }
QLabel#empty { color: #7a8494; font-size: 11pt; padding: 24px; }
"""
