"""psycopg 3's own listener API through parsnip (issue 27): `conn.notifies(timeout=…,
stop_after=…)`, the generator a psycopg application waits on.

A listener connection (autocommit) LISTENs on `ln_plain` and on the quoted mixed-case
`"Ln_MiXed"`; a second connection sends NOTIFYs: plain, non-ASCII and empty payloads,
`pg_notify()`, a transaction that rolls back (psycopg.Rollback) and one that commits
(`conn.transaction()`), and one on `ln_mixed` (the unquoted, folded name: not the
listener's). The listener must get exactly the committed ones of its channels, in order,
channel names and payloads byte for byte. Then it UNLISTENs `"Ln_MiXed"` and must not get
that channel's next one. Every wait is bounded by the generator's timeout. The result line
follows drivers/README.md's contract.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psycopg

TARGET_URL = os.environ["TARGET_URL"]
WAIT_S = 10.0

PLAIN, MIXED = "ln_plain", "Ln_MiXed"
NON_ASCII = "grüße ✓ 日本語 'q' \\ \"dq\""


def expect_notifies(listener: psycopg.Connection, want: list[tuple[str, str]], errors: list[str], step: str) -> None:
    """Waits (at most WAIT_S) for len(want) notifications; they must be exactly `want`."""
    got = [(n.channel, n.payload) for n in listener.notifies(timeout=WAIT_S, stop_after=len(want))]
    if got != want:
        errors.append(f"{step}: got {got!r}, want {want!r}")


def main() -> None:
    t0 = time.monotonic()
    errors: list[str] = []
    sent = 0
    with psycopg.connect(TARGET_URL, autocommit=True) as listener, psycopg.connect(TARGET_URL, autocommit=True) as s:
        listener.execute(f"LISTEN {PLAIN}")
        listener.execute(f'LISTEN "{MIXED}"')

        def notify(ch: str, payload: str, conn: psycopg.Connection = s) -> None:
            nonlocal sent
            conn.execute("SELECT pg_notify(%s, %s)", (ch, payload))
            sent += 1

        s.execute(f"NOTIFY {PLAIN}, 'first'")
        sent += 1
        notify(MIXED, NON_ASCII)
        notify(PLAIN, "")
        with s.transaction(force_rollback=True):
            notify(PLAIN, "rolled back")
            notify(MIXED, "rolled back")
        try:
            with s.transaction():
                notify(PLAIN, "rolled back by an exception")
                raise psycopg.Rollback()
        except psycopg.Rollback:
            errors.append("psycopg.Rollback escaped its transaction block")
        with s.transaction():
            notify(MIXED, "committed 1")
            s.execute(f"NOTIFY {PLAIN}, 'committed 2'")
            sent += 1
        notify("ln_mixed", "folded name: not the listener's")
        notify(PLAIN, "last")
        expect_notifies(
            listener,
            [(PLAIN, "first"), (MIXED, NON_ASCII), (PLAIN, ""), (MIXED, "committed 1"), (PLAIN, "committed 2"),
             (PLAIN, "last")],
            errors,
            "before UNLISTEN",
        )
        listener.execute(f'UNLISTEN "{MIXED}"')
        notify(MIXED, "after the UNLISTEN")
        notify(PLAIN, "final")
        # The next one must be `final`: the UNLISTENed channel's, sent before it, is not.
        expect_notifies(listener, [(PLAIN, "final")], errors, "after UNLISTEN")
    detail = f"psycopg {psycopg.__version__} notifies(): {sent} notifications sent, {time.monotonic() - t0:.1f}s"
    if errors:
        detail += "; errors: " + " | ".join(errors)
        for e in errors:
            print(f"ERROR {e}", file=sys.stderr)
    print(json.dumps({"ok": not errors, "transactions": sent, "errors": len(errors), "expected_errors": 0,
                      "detail": detail}), flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
