// pgx's own listener API through parsnip (issue 27): `conn.WaitForNotification(ctx)`.
//
// `pgx-scenarios -mode listen`: a listener connection LISTENs on `ln_plain` and on the
// quoted mixed-case `"Ln_MiXed"`; a second connection sends NOTIFYs: plain, non-ASCII and
// empty payloads, pg_notify() with parameters, a transaction that rolls back (tx.Rollback)
// and one that commits (pgx.BeginFunc), and one on `ln_mixed` (the folded name: not the
// listener's). The listener must get exactly the committed ones of its channels, in order,
// channel names and payloads byte for byte. Then it UNLISTENs `"Ln_MiXed"` and must not get
// that channel's next one. Every wait is bounded by the context given to
// WaitForNotification. The result line follows drivers/README.md's contract.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	listenWait  = 10 * time.Second
	lnPlain     = "ln_plain"
	lnMixed     = "Ln_MiXed"
	lnNonASCII  = `grüße ✓ 日本語 'q' \ "dq"`
	listenTotal = 40 * time.Second
)

type lnNote struct{ Channel, Payload string }

func runListen() {
	t0 := time.Now()
	var errs []string
	sent := 0
	report := func() {
		detail := fmt.Sprintf("pgx %s WaitForNotification: %d notifications sent, %.1fs", pgxVersion(), sent,
			time.Since(t0).Seconds())
		if len(errs) > 0 {
			detail += "; errors: " + strings.Join(errs, " | ")
			for _, e := range errs {
				fmt.Fprintln(os.Stderr, "ERROR", e)
			}
		}
		out, _ := json.Marshal(map[string]any{"ok": len(errs) == 0, "transactions": sent, "errors": len(errs),
			"expected_errors": 0, "detail": detail})
		fmt.Println(string(out))
		if len(errs) > 0 {
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), listenTotal)
	defer cancel()
	fail := func(step string, err error) {
		errs = append(errs, step+": "+describe(err))
		report()
	}
	listener, err := pgx.Connect(ctx, os.Getenv("TARGET_URL"))
	if err != nil {
		fail("listener connect", err)
	}
	s, err := pgx.Connect(ctx, os.Getenv("TARGET_URL"))
	if err != nil {
		fail("sender connect", err)
	}
	for _, q := range []string{"LISTEN " + lnPlain, `LISTEN "` + lnMixed + `"`} {
		if _, err := listener.Exec(ctx, q); err != nil {
			fail(q, err)
		}
	}
	notify := func(q pgx.Tx, ch, payload string) {
		var err error
		if q != nil {
			_, err = q.Exec(ctx, "SELECT pg_notify($1, $2)", ch, payload)
		} else {
			_, err = s.Exec(ctx, "SELECT pg_notify($1, $2)", ch, payload)
		}
		if err != nil {
			fail("notify "+ch, err)
		}
		sent++
	}
	if _, err := s.Exec(ctx, "NOTIFY "+lnPlain+", 'first'"); err != nil {
		fail("NOTIFY", err)
	}
	sent++
	notify(nil, lnMixed, lnNonASCII)
	notify(nil, lnPlain, "")
	tx, err := s.Begin(ctx)
	if err != nil {
		fail("begin", err)
	}
	notify(tx, lnPlain, "rolled back")
	notify(tx, lnMixed, "rolled back")
	if err := tx.Rollback(ctx); err != nil {
		fail("rollback", err)
	}
	errRollMeBack := errors.New("roll me back")
	if err := pgx.BeginFunc(ctx, s, func(tx pgx.Tx) error {
		notify(tx, lnPlain, "rolled back by an error")
		return errRollMeBack
	}); !errors.Is(err, errRollMeBack) {
		fail("BeginFunc rolled back", err)
	}
	if err := pgx.BeginFunc(ctx, s, func(tx pgx.Tx) error {
		notify(tx, lnMixed, "committed 1")
		_, err := tx.Exec(ctx, "NOTIFY "+lnPlain+", 'committed 2'")
		sent++
		return err
	}); err != nil {
		fail("BeginFunc committed", err)
	}
	notify(nil, "ln_mixed", "folded name: not the listener's")
	notify(nil, lnPlain, "last")
	expect := func(step string, want []lnNote) {
		var got []lnNote
		for range want {
			wctx, wcancel := context.WithTimeout(ctx, listenWait)
			n, err := listener.WaitForNotification(wctx)
			wcancel()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: after %v: %s", step, got, describe(err)))
				return
			}
			got = append(got, lnNote{n.Channel, n.Payload})
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			errs = append(errs, fmt.Sprintf("%s: got %q, want %q", step, got, want))
		}
	}
	expect("before UNLISTEN", []lnNote{{lnPlain, "first"}, {lnMixed, lnNonASCII}, {lnPlain, ""},
		{lnMixed, "committed 1"}, {lnPlain, "committed 2"}, {lnPlain, "last"}})
	if len(errs) > 0 {
		report()
	}
	if _, err := listener.Exec(ctx, `UNLISTEN "`+lnMixed+`"`); err != nil {
		fail("UNLISTEN", err)
	}
	notify(nil, lnMixed, "after the UNLISTEN")
	notify(nil, lnPlain, "final")
	// The next one must be `final`: the UNLISTENed channel's, sent before it, is not.
	expect("after UNLISTEN", []lnNote{{lnPlain, "final"}})
	_ = listener.Close(ctx)
	_ = s.Close(ctx)
	report()
}
