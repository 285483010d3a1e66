// pgx v5 driver scenarios for parsnip's driver matrix (see drivers/README.md).
//
// One binary, one scenario per run: `pgx-scenarios -mode cache_statement|cache_describe|
// describe_exec|exec|simple_protocol|batch|pool` (and `listen`: listen.go). Environment: TARGET_URL (where the
// workload connects: PostgreSQL or parsnip), DIRECT_URL (PostgreSQL itself, for setup, the
// schema changes and the final checks), CLIENTS (default 100), VIA_PARSNIP. The last line
// on stdout is one JSON object {"ok","transactions","errors","expected_errors",
// "expected_kinds" (expected errors by SQLSTATE),"detail"}; the exit code is 0 when ok.
// Diagnostics go to stderr (DRIVER_VERBOSE=1 also lists the expected errors).
//
// Every scenario runs CLIENTS goroutines, each with its own connection (or, in `pool`
// mode, sharing a pgxpool of MaxConns = CLIENTS), through five phases:
//
//  1. work: transactions that insert and update the client's own rows and read them back
//     (count and sum checked inside the transaction), a `SELECT * FROM wide` checked
//     column by column, and one of 50 distinct query texts (more than parsnip's
//     per-server cap of 20);
//  2. schema change under load: while every client keeps running phase 1's work, the
//     coordinator runs `ALTER TABLE wide ADD COLUMN c`, waits until every client has read
//     the new shape on its own connection, then `ALTER TABLE wide ALTER COLUMN a TYPE
//     bigint`, and waits again. Where PostgreSQL itself makes pgx fail once (0A000 "cached
//     plan must not change result type" on a statement pgx prepared before the change),
//     one such error per connection and change is counted in expected_errors; any other
//     error, a second one, or a result whose shape is older than the committed schema or
//     whose row has a different column count than its description is an error;
//  3. a failing statement inside a transaction and inside a batch (pipeline), then
//     recovery on the same connection (and the failed writes must not be visible);
//  4. the cancel API (a context cancelled once PostgreSQL shows the pg_sleep running, pgx
//     sending a CancelRequest; the same connection must then work), and abrupt client
//     disconnects mid-transaction (socket closed while idle in a transaction holding a
//     row lock, and while a query is running): the lock must become free and the writes
//     must be gone;
//  5. read-back of every client's rows (count, sum, checksum) through TARGET_URL and
//     through DIRECT_URL, no backend left idle in transaction, and the cancel API on a
//     query that waits for a server connection (eight connections run pg_sleep(2) first):
//     PostgreSQL answers it with 57014 at once, and so must a pooler.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	churnTexts     = 50   // distinct query texts, more than max_prepared_statements = 20
	wideRows       = 1000 // rows in table wide
	phase1Iters    = 12   // work iterations before the schema changes
	phase3Iters    = 6    // work iterations after them
	clientDeadline = 85 * time.Second
	stageTimeout   = 25 * time.Second // every client must have seen a schema change by then
	totalDeadline  = 100 * time.Second
	wideSQL        = "SELECT * FROM wide WHERE id = $1"
	pgxModulePath  = "github.com/jackc/pgx/v5"
)

type modeSpec struct {
	exec  pgx.QueryExecMode
	batch bool // the work runs through SendBatch
	pool  bool // pgxpool instead of one connection per client
	// SQLSTATEs PostgreSQL itself raises for this mode right after a schema change, on a
	// statement (or cached description) made before it: once per connection and change.
	expected map[string]bool
}

var modes = map[string]modeSpec{
	"cache_statement": {exec: pgx.QueryExecModeCacheStatement, expected: map[string]bool{"0A000": true}},
	"cache_describe":  {exec: pgx.QueryExecModeCacheDescribe, expected: map[string]bool{"08P01": true}},
	"describe_exec":   {exec: pgx.QueryExecModeDescribeExec, expected: map[string]bool{"0A000": true}},
	"exec":            {exec: pgx.QueryExecModeExec},
	"simple_protocol": {exec: pgx.QueryExecModeSimpleProtocol},
	"batch":           {exec: pgx.QueryExecModeCacheStatement, batch: true, expected: map[string]bool{"0A000": true}},
	"pool":            {exec: pgx.QueryExecModeCacheStatement, pool: true, expected: map[string]bool{"0A000": true}},
}

// ---------------------------------------------------------------------------- reporting

type report struct {
	transactions   atomic.Int64
	queries        atomic.Int64
	errors         atomic.Int64
	expectedErrors atomic.Int64
	injected       atomic.Int64 // deliberate errors that behaved as PostgreSQL says
	cancels        atomic.Int64
	disconnects    atomic.Int64

	mu      sync.Mutex
	samples []string
	kinds   map[string]int64 // expected errors by SQLSTATE
}

func (r *report) fail(format string, args ...any) {
	r.errors.Add(1)
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "ERROR:", msg)
	r.mu.Lock()
	if len(r.samples) < 5 {
		r.samples = append(r.samples, msg)
	}
	r.mu.Unlock()
}

func (r *report) expected(code, format string, args ...any) {
	r.expectedErrors.Add(1)
	r.mu.Lock()
	if r.kinds == nil {
		r.kinds = map[string]int64{}
	}
	r.kinds[code]++
	r.mu.Unlock()
	if os.Getenv("DRIVER_VERBOSE") != "" {
		fmt.Fprintln(os.Stderr, "expected:", fmt.Sprintf(format, args...))
	}
}

var (
	rep       report
	startTime = time.Now()
	printOnce sync.Once
	modeName  string
	clients   int
	notes     []string
	notesMu   sync.Mutex
)

func note(format string, args ...any) {
	notesMu.Lock()
	notes = append(notes, fmt.Sprintf(format, args...))
	notesMu.Unlock()
}

func finish(fatal string) {
	printOnce.Do(func() {
		if fatal != "" {
			rep.fail("%s", fatal)
		}
		errs := rep.errors.Load()
		rep.mu.Lock()
		samples := strings.Join(rep.samples, " | ")
		kinds := map[string]int64{}
		for k, v := range rep.kinds {
			kinds[k] = v
		}
		rep.mu.Unlock()
		notesMu.Lock()
		ns := strings.Join(notes, "; ")
		notesMu.Unlock()
		detail := fmt.Sprintf("pgx %s mode=%s clients=%d via_parsnip=%s %.1fs: txns=%d queries=%d injected-errors-ok=%d cancels=%d disconnects=%d",
			pgxVersion(), modeName, clients, os.Getenv("VIA_PARSNIP"), time.Since(startTime).Seconds(),
			rep.transactions.Load(), rep.queries.Load(), rep.injected.Load(), rep.cancels.Load(), rep.disconnects.Load())
		if ns != "" {
			detail += "; " + ns
		}
		if samples != "" {
			detail += "; first errors: " + samples
		}
		out, _ := json.Marshal(map[string]any{
			"ok":              errs == 0,
			"transactions":    rep.transactions.Load(),
			"errors":          errs,
			"expected_errors": rep.expectedErrors.Load(),
			"expected_kinds":  kinds,
			"detail":          detail,
		})
		fmt.Println(string(out))
		if errs != 0 {
			os.Exit(1)
		}
		os.Exit(0)
	})
}

func pgxVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == pgxModulePath {
				return d.Version
			}
		}
	}
	return "unknown"
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func describe(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s %s (%s)", pe.Code, pe.Message, pe.Routine)
	}
	return err.Error()
}

// ---------------------------------------------------------------------------- shared state

var (
	spec      modeSpec
	targetURL string
	directURL string
	stage     atomic.Int64 // schema changes committed: 0, 1 (column c added), 2 (a is bigint)
	started   atomic.Int64 // schema changes begun (the expected-error allowance per connection)
	ready     atomic.Int64 // clients done with phase 1
	confirmed [3]atomic.Int64
	gone      atomic.Int64 // clients that stopped early (an error was counted)
	pool      *pgxpool.Pool
	direct    *pgxpool.Pool // PostgreSQL itself, for pg_stat_activity
	allowMu   sync.Mutex
	allowance = map[*pgx.Conn]int{} // expected errors used, per connection
)

// errWide marks an error of the wide query (the only one a schema change may break).
type errWide struct{ err error }

func (e errWide) Error() string { return e.err.Error() }
func (e errWide) Unwrap() error { return e.err }

// classify counts err as expected (one per connection and schema change, only for the
// wide query, only a SQLSTATE PostgreSQL raises for this mode) or as an error.
func classify(conn *pgx.Conn, what string, err error) {
	var w errWide
	code := sqlstate(err)
	if errors.As(err, &w) && spec.expected[code] {
		allowMu.Lock()
		used := allowance[conn]
		ok := used < int(started.Load())
		if ok {
			allowance[conn] = used + 1
		}
		allowMu.Unlock()
		if ok {
			rep.expected(code, "%s: %s", what, describe(err))
			return
		}
		rep.fail("%s: %s (more than one per connection and schema change)", what, describe(err))
		return
	}
	rep.fail("%s: %s", what, describe(err))
}

// ---------------------------------------------------------------------------- connections

func connConfig(cancelRequest bool) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(targetURL)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = spec.exec
	if cancelRequest {
		// On a cancelled context, send a CancelRequest (the driver's cancel API) and keep
		// the connection; fall back to closing it only after 5 s.
		cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
		}
	}
	return cfg, nil
}

func connect(ctx context.Context, cancelRequest bool) (*pgx.Conn, error) {
	cfg, err := connConfig(cancelRequest)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

func directExec(ctx context.Context, sql string) error {
	c, err := pgx.Connect(ctx, directURL)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, sql)
	return err
}

// ---------------------------------------------------------------------------- one client

type client struct {
	id     int
	conn   *pgx.Conn // nil in pool mode
	rows   map[int]int64
	nextK  int
	broken bool // its expected state is unknown (a COMMIT failed)
	seen   int  // newest wide shape read
	errs   int  // failed iterations; past maxClientErrors the client stops
}

const maxClientErrors = 20

func (cl *client) expect() (n, sum, check int64) {
	for k, v := range cl.rows {
		n++
		sum += v
		check += int64(k) * v
	}
	return
}

// with runs f on the client's connection (pool mode: one acquired for this call).
func (cl *client) with(ctx context.Context, f func(conn *pgx.Conn) error) error {
	if !spec.pool {
		return f(cl.conn)
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer pc.Release()
	return f(pc.Conn())
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readWide runs the wide query and checks the row column by column. It returns the shape
// it saw (0, 1 or 2 schema changes) and fails on a shape older than the committed one.
func (cl *client) readWide(ctx context.Context, q querier, id int) error {
	st := int(stage.Load())
	rep.queries.Add(1)
	rows, err := q.Query(ctx, wideSQL, id)
	if err != nil {
		return errWide{err}
	}
	defer rows.Close()
	got := 0
	for rows.Next() {
		got++
		fds := rows.FieldDescriptions()
		raw := rows.RawValues()
		if len(raw) != len(fds) {
			rows.Close()
			return fmt.Errorf("SHAPE MISMATCH: row has %d values, description %d columns", len(raw), len(fds))
		}
		vals, err := rows.Values()
		if err != nil {
			return errWide{err}
		}
		shape, err := checkWide(fds, vals, id)
		if err != nil {
			return err
		}
		if shape < st {
			return fmt.Errorf("stale result shape: saw %d schema changes, %d committed before the query", shape, st)
		}
		if shape > cl.seen {
			cl.seen = shape
		}
	}
	if err := rows.Err(); err != nil {
		return errWide{err}
	}
	if got != 1 {
		return fmt.Errorf("wide id %d: %d rows, want 1", id, got)
	}
	return nil
}

func checkWide(fds []pgconn.FieldDescription, vals []any, id int) (int, error) {
	names := make([]string, len(fds))
	for i, f := range fds {
		names[i] = f.Name
	}
	joined := strings.Join(names, ",")
	var shape int
	switch joined {
	case "id,a,b":
		shape = 0
	case "id,a,b,c":
		shape = 1
	default:
		return 0, fmt.Errorf("wide: unexpected columns %q", joined)
	}
	if v, ok := vals[0].(int32); !ok || int(v) != id {
		return 0, fmt.Errorf("wide id %d: id = %#v", id, vals[0])
	}
	switch a := vals[1].(type) {
	case int32:
		if int(a) != id*10 {
			return 0, fmt.Errorf("wide id %d: a = %d", id, a)
		}
	case int64:
		if int(a) != id*10 {
			return 0, fmt.Errorf("wide id %d: a = %d", id, a)
		}
		if shape == 1 {
			shape = 2
		} else {
			return 0, fmt.Errorf("wide id %d: a is bigint but c is missing", id)
		}
	default:
		return 0, fmt.Errorf("wide id %d: a = %#v (%T)", id, vals[1], vals[1])
	}
	if b, ok := vals[2].(string); !ok || b != "w"+strconv.Itoa(id) {
		return 0, fmt.Errorf("wide id %d: b = %#v", id, vals[2])
	}
	if shape >= 1 {
		if c, ok := vals[3].(int32); !ok || c != 7 {
			return 0, fmt.Errorf("wide id %d: c = %#v", id, vals[3])
		}
	}
	return shape, nil
}

func churnSQL(j int) string {
	return fmt.Sprintf("SELECT $1::int + %d AS r, count(*) AS n FROM acct WHERE client = $1", j)
}

// iterate runs one unit of work; on an expected error it is retried (twice at most).
func (cl *client) iterate(ctx context.Context, i int) {
	for attempt := 0; attempt < 3; attempt++ {
		var err error
		var used *pgx.Conn
		err = cl.with(ctx, func(conn *pgx.Conn) error {
			used = conn
			if spec.batch {
				return cl.workBatch(ctx, conn, i)
			}
			return cl.work(ctx, conn, i)
		})
		if err == nil {
			return
		}
		before := rep.errors.Load()
		classify(used, fmt.Sprintf("client %d iteration %d", cl.id, i), err)
		if rep.errors.Load() != before || used == nil || used.IsClosed() {
			cl.errs++
			return
		}
	}
	rep.fail("client %d iteration %d: still failing after retries", cl.id, i)
}

// work: a read-write transaction with read-back, then autocommit reads.
func (cl *client) work(ctx context.Context, conn *pgx.Conn, i int) error {
	k := cl.nextK
	v := int64(cl.id*1000 + k)
	uk, delta := k/2, int64(k%7+1)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "INSERT INTO acct (client, k, v) VALUES ($1, $2, $3)", cl.id, k, v); err != nil {
		return err
	}
	ct, err := tx.Exec(ctx, "UPDATE acct SET v = v + $3 WHERE client = $1 AND k = $2", cl.id, uk, delta)
	if err != nil {
		return err
	}
	if ct.RowsAffected() != 1 {
		return fmt.Errorf("WRONG RESULT: update affected %d rows", ct.RowsAffected())
	}
	rep.queries.Add(3)
	if err := cl.checkInTx(ctx, tx, k, v, uk, delta); err != nil {
		return err
	}
	if err := cl.readWide(ctx, tx, (cl.id*7+i)%wideRows+1); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		cl.broken = true
		return fmt.Errorf("commit: %w", err)
	}
	cl.apply(k, v, uk, delta)
	// autocommit: one of the churn texts, and the wide query again.
	j := (cl.id + i*7) % churnTexts
	var r, n int64
	rep.queries.Add(1)
	if err := conn.QueryRow(ctx, churnSQL(j), cl.id).Scan(&r, &n); err != nil {
		return err
	}
	if r != int64(cl.id+j) || n != int64(len(cl.rows)) {
		return fmt.Errorf("WRONG RESULT: churn %d: r=%d n=%d, want %d %d", j, r, n, cl.id+j, len(cl.rows))
	}
	return cl.readWide(ctx, conn, (cl.id*13+i)%wideRows+1)
}

func (cl *client) checkInTx(ctx context.Context, tx pgx.Tx, k int, v int64, uk int, delta int64) error {
	var n, s int64
	rep.queries.Add(1)
	if err := tx.QueryRow(ctx, "SELECT count(*), coalesce(sum(v), 0)::bigint FROM acct WHERE client = $1", cl.id).Scan(&n, &s); err != nil {
		return err
	}
	en, es, _ := cl.expect()
	en++
	es += v + delta
	if n != en || s != es {
		return fmt.Errorf("WRONG RESULT: read-back in transaction: count %d sum %d, want %d %d", n, s, en, es)
	}
	return nil
}

func (cl *client) apply(k int, v int64, uk int, delta int64) {
	cl.rows[k] = v
	cl.rows[uk] += delta
	cl.nextK++
	rep.transactions.Add(1)
}

// workBatch: the same work, pipelined with SendBatch inside the transaction, and a batch
// of churn texts outside it.
func (cl *client) workBatch(ctx context.Context, conn *pgx.Conn, i int) error {
	k := cl.nextK
	v := int64(cl.id*1000 + k)
	uk, delta := k/2, int64(k%7+1)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	b := &pgx.Batch{}
	b.Queue("INSERT INTO acct (client, k, v) VALUES ($1, $2, $3)", cl.id, k, v)
	b.Queue("UPDATE acct SET v = v + $3 WHERE client = $1 AND k = $2", cl.id, uk, delta)
	b.Queue("SELECT count(*), coalesce(sum(v), 0)::bigint FROM acct WHERE client = $1", cl.id)
	wideID := (cl.id*7+i)%wideRows + 1
	b.Queue(wideSQL, wideID)
	rep.queries.Add(4)
	st := int(stage.Load())
	br := tx.SendBatch(ctx, b)
	err = func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		ct, err := br.Exec()
		if err != nil {
			return err
		}
		if ct.RowsAffected() != 1 {
			return fmt.Errorf("WRONG RESULT: update affected %d rows", ct.RowsAffected())
		}
		var n, s int64
		if err := br.QueryRow().Scan(&n, &s); err != nil {
			return err
		}
		en, es, _ := cl.expect()
		if n != en+1 || s != es+v+delta {
			return fmt.Errorf("WRONG RESULT: read-back in batch: count %d sum %d, want %d %d", n, s, en+1, es+v+delta)
		}
		rows, err := br.Query()
		if err != nil {
			return errWide{err}
		}
		defer rows.Close()
		got := 0
		for rows.Next() {
			got++
			fds, raw := rows.FieldDescriptions(), rows.RawValues()
			if len(raw) != len(fds) {
				return fmt.Errorf("SHAPE MISMATCH: row has %d values, description %d columns", len(raw), len(fds))
			}
			vals, err := rows.Values()
			if err != nil {
				return errWide{err}
			}
			shape, err := checkWide(fds, vals, wideID)
			if err != nil {
				return err
			}
			if shape < st {
				return fmt.Errorf("stale result shape: saw %d schema changes, %d committed before the batch", shape, st)
			}
			if shape > cl.seen {
				cl.seen = shape
			}
		}
		if err := rows.Err(); err != nil {
			return errWide{err}
		}
		if got != 1 {
			return fmt.Errorf("wide id %d: %d rows", wideID, got)
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		cl.broken = true
		return fmt.Errorf("commit: %w", err)
	}
	cl.apply(k, v, uk, delta)
	// autocommit batch: three churn texts and the wide query.
	b = &pgx.Batch{}
	var js []int
	for x := 0; x < 3; x++ {
		j := (cl.id + i*7 + x*17) % churnTexts
		js = append(js, j)
		b.Queue(churnSQL(j), cl.id)
	}
	rep.queries.Add(3)
	br = conn.SendBatch(ctx, b)
	for _, j := range js {
		var r, n int64
		if err := br.QueryRow().Scan(&r, &n); err != nil {
			br.Close()
			return err
		}
		if r != int64(cl.id+j) || n != int64(len(cl.rows)) {
			br.Close()
			return fmt.Errorf("WRONG RESULT: churn %d: r=%d n=%d", j, r, n)
		}
	}
	if err := br.Close(); err != nil {
		return err
	}
	return cl.readWide(ctx, conn, (cl.id*13+i)%wideRows+1)
}

// ---------------------------------------------------------------------------- phase 3 and 4

func (cl *client) errorInTransaction(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "INSERT INTO errtx (client, note) VALUES ($1, $2)", cl.id, "tx"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT 1 / $1::int", 0); sqlstate(err) != "22012" {
		return fmt.Errorf("error in transaction: got %v, want 22012", err)
	}
	if _, err := tx.Exec(ctx, "SELECT $1::int", 1); sqlstate(err) != "25P02" {
		return fmt.Errorf("statement after the error: got %v, want 25P02", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		return fmt.Errorf("rollback after error: %w", err)
	}
	rep.injected.Add(2)
	return cl.recovered(ctx, conn, "error in transaction", "tx")
}

func (cl *client) errorInBatch(ctx context.Context, conn *pgx.Conn) error {
	b := &pgx.Batch{}
	b.Queue("INSERT INTO errtx (client, note) VALUES ($1, $2)", cl.id, "batch")
	b.Queue("SELECT 1 / $1::int", 0)
	b.Queue("INSERT INTO errtx (client, note) VALUES ($1, $2)", cl.id, "batch-after")
	br := conn.SendBatch(ctx, b)
	_, e1 := br.Exec()
	_, e2 := br.Exec()
	_, e3 := br.Exec()
	br.Close()
	if e1 != nil {
		return fmt.Errorf("batch statement 1: %w", e1)
	}
	if sqlstate(e2) != "22012" {
		return fmt.Errorf("batch statement 2: got %v, want 22012", e2)
	}
	if e3 == nil {
		return fmt.Errorf("batch statement 3 succeeded after an error in the batch")
	}
	rep.injected.Add(1)
	// A working batch on the same connection.
	b = &pgx.Batch{}
	for x := 0; x < 3; x++ {
		b.Queue("SELECT $1::int * 2", cl.id+x)
	}
	br = conn.SendBatch(ctx, b)
	for x := 0; x < 3; x++ {
		var r int
		if err := br.QueryRow().Scan(&r); err != nil || r != (cl.id+x)*2 {
			br.Close()
			return fmt.Errorf("batch after the failed batch: r=%d err=%v", r, err)
		}
	}
	if err := br.Close(); err != nil {
		return err
	}
	return cl.recovered(ctx, conn, "error in batch", "batch", "batch-after")
}

func (cl *client) recovered(ctx context.Context, conn *pgx.Conn, after string, notes ...string) error {
	var n int64
	rep.queries.Add(1)
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM errtx WHERE client = $1 AND note = ANY($2)", cl.id, notes).Scan(&n); err != nil {
		return fmt.Errorf("after %s: %w", after, err)
	}
	if n != 0 {
		return fmt.Errorf("WRONG RESULT: after %s: %d rows of the failed writes are visible", after, n)
	}
	return nil
}

// cancel: the driver's cancel API on a running query (autocommit or inside a
// transaction): once PostgreSQL shows the pg_sleep running, the context is cancelled and
// pgx sends a CancelRequest. The query must end with 57014, quickly, and the same
// connection must then work.
func (cl *client) cancel(ctx context.Context, conn *pgx.Conn, inTx bool) error {
	var tx pgx.Tx
	var err error
	ex := func(c context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
		return conn.Exec(c, sql, args...)
	}
	marker := fmt.Sprintf("/* cancel c%d */", cl.id)
	sql := "SELECT pg_sleep($1) " + marker
	if _, err := conn.Exec(ctx, sql, 0.0); err != nil { // prepared (where cached) beforehand
		return err
	}
	if inTx {
		if tx, err = conn.Begin(ctx); err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, "INSERT INTO errtx (client, note) VALUES ($1, $2)", cl.id, "cancel"); err != nil {
			return err
		}
		ex = tx.Exec
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := make(chan error, 1)
	go func() { _, err := ex(cctx, sql, 10.0); res <- err }()
	if err := waitRunning(ctx, marker, res); err != nil {
		return err
	}
	t0 := time.Now()
	cancel()
	select {
	case err = <-res:
	case <-time.After(8 * time.Second):
		return fmt.Errorf("cancel: no answer 8 s after the cancel")
	}
	took := time.Since(t0)
	if err == nil {
		return fmt.Errorf("cancel: pg_sleep(10) was not cancelled")
	}
	if conn.IsClosed() {
		return fmt.Errorf("cancel: the connection was closed (%v after %s); the CancelRequest did not end the query", err, took.Round(time.Millisecond))
	}
	if sqlstate(err) != "57014" {
		return fmt.Errorf("cancel: got %v, want 57014", describe(err))
	}
	if took > 4*time.Second {
		return fmt.Errorf("cancel took %s", took)
	}
	if inTx {
		if err := tx.Rollback(ctx); err != nil {
			return fmt.Errorf("rollback after cancel: %w", err)
		}
	}
	rep.cancels.Add(1)
	var r int
	if err := conn.QueryRow(ctx, "SELECT $1::int + 1", 41).Scan(&r); err != nil || r != 42 {
		return fmt.Errorf("query after cancel: r=%d err=%v", r, err)
	}
	return cl.recovered(ctx, conn, "cancel", "cancel")
}

// waitRunning waits until PostgreSQL shows a query containing marker running for 200 ms
// (so pg_sleep itself, not a Parse or Describe of it), or the query ends early.
func waitRunning(ctx context.Context, marker string, res chan error) error {
	t0 := time.Now()
	deadline := t0.Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var n int64
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active'
AND pid <> pg_backend_pid() AND position($1 in query) > 0 AND now() - query_start > interval '200 ms'`, marker).Scan(&n); err != nil {
			return fmt.Errorf("pg_stat_activity: %w", err)
		}
		if n > 0 {
			return nil
		}
		select {
		case err := <-res:
			return fmt.Errorf("query ended %s after it was sent, before it was cancelled: %v", time.Since(t0).Round(time.Millisecond), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("query not running on PostgreSQL after 20 s")
}

// queuedCancel: the cancel API on a query that has been sent but does not run yet: eight
// connections run pg_sleep(2) (through parsnip they hold every server connection of a
// pool of up to eight), and one more sends pg_sleep(10) and cancels it 500 ms later.
// PostgreSQL ends it with 57014 right away; so must a pooler (by answering 57014 itself,
// or by forwarding the cancel once the query reaches a server).
func queuedCancel(ctx context.Context) {
	var hold sync.WaitGroup
	v, err := connect(ctx, true)
	if err != nil {
		rep.fail("queued cancel: connect: %s", describe(err))
		return
	}
	defer v.Close(context.Background())
	for h := 0; h < 8; h++ {
		hold.Add(1)
		go func() {
			defer hold.Done()
			c, err := connect(ctx, false)
			if err != nil {
				rep.fail("queued cancel: holder connect: %s", describe(err))
				return
			}
			defer c.Close(context.Background())
			if _, err := c.Exec(ctx, "SELECT pg_sleep($1)", 2.0); err != nil {
				rep.fail("queued cancel: holder: %s", describe(err))
			}
		}()
	}
	defer hold.Wait()
	const sql = "SELECT pg_sleep($1) /* queued cancel */"
	if _, err := v.Exec(ctx, sql, 0.0); err != nil { // prepared (where cached) beforehand
		rep.fail("queued cancel: %s", describe(err))
		return
	}
	time.Sleep(300 * time.Millisecond) // the holders' queries are running
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	t0 := time.Now()
	_, err = v.Exec(cctx, sql, 10.0)
	cancel()
	took := time.Since(t0)
	switch {
	case err == nil:
		rep.fail("queued cancel: pg_sleep(10) was not cancelled")
	case v.IsClosed():
		rep.fail("queued cancel: the CancelRequest was lost: the query was still running %s later and pgx closed the connection (%v)", took.Round(time.Millisecond), err)
	case sqlstate(err) != "57014":
		rep.fail("queued cancel: got %s, want 57014", describe(err))
	default:
		var r int
		if err := v.QueryRow(ctx, "SELECT $1::int + 1", 1).Scan(&r); err != nil || r != 2 {
			rep.fail("queued cancel: query after the cancel: r=%d err=%v", r, err)
		} else {
			rep.cancels.Add(1)
			note("queued cancel answered 57014 after %s", took.Round(time.Millisecond))
		}
	}
}

// disconnect: a second connection takes a row lock and writes inside a transaction, then
// goes away without Terminate (midQuery: while pg_sleep runs, through pgx's default
// context handling, which closes the socket). The lock must become free and the write
// must be gone.
func (cl *client) disconnect(ctx context.Context, midQuery bool) error {
	tag := fmt.Sprintf("c%d-%v", cl.id, midQuery)
	var d *pgx.Conn
	var release func()
	if spec.pool {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		d, release = pc.Conn(), pc.Release
	} else {
		var err error
		if d, err = connect(ctx, false); err != nil {
			return err
		}
		release = func() { d.Close(context.Background()) }
	}
	tx, err := d.Begin(ctx)
	if err != nil {
		release()
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO ghost (tag) VALUES ($1)", tag); err != nil {
		release()
		return err
	}
	var id int
	if err := tx.QueryRow(ctx, "SELECT id FROM lockrow WHERE id = $1 FOR UPDATE", cl.id).Scan(&id); err != nil {
		release()
		return err
	}
	if midQuery {
		if spec.pool { // pool connections send CancelRequests; close the socket instead
			go func() { time.Sleep(300 * time.Millisecond); d.PgConn().Conn().Close() }()
			_, err = tx.Exec(ctx, "SELECT pg_sleep($1)", 3.0)
		} else {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = tx.Exec(cctx, "SELECT pg_sleep($1)", 3.0)
			cancel()
		}
		if err == nil {
			release()
			return fmt.Errorf("disconnect: pg_sleep finished")
		}
	} else {
		d.PgConn().Conn().Close()
	}
	release()
	rep.disconnects.Add(1)
	// The lock must be free again (PostgreSQL rolled the transaction back).
	return cl.with(ctx, func(conn *pgx.Conn) error {
		t0 := time.Now()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT id FROM lockrow WHERE id = $1 FOR UPDATE", cl.id).Scan(&id); err != nil {
			return fmt.Errorf("row lock of the disconnected client (after %s): %s", time.Since(t0).Round(time.Millisecond), describe(err))
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM ghost WHERE tag = $1", tag).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("WRONG RESULT: the disconnected client's write is visible")
		}
		return nil
	})
}

func (cl *client) readBack(ctx context.Context) error {
	return cl.with(ctx, func(conn *pgx.Conn) error {
		var n, s, c int64
		rep.queries.Add(1)
		err := conn.QueryRow(ctx, "SELECT count(*), coalesce(sum(v), 0)::bigint, coalesce(sum(k::bigint * v), 0)::bigint FROM acct WHERE client = $1", cl.id).Scan(&n, &s, &c)
		if err != nil {
			return err
		}
		en, es, ec := cl.expect()
		if n != en || s != es || c != ec {
			return fmt.Errorf("WRONG RESULT: read-back: count/sum/checksum %d/%d/%d, want %d/%d/%d", n, s, c, en, es, ec)
		}
		return nil
	})
}

func (cl *client) run(ctx context.Context) {
	stopped := false
	stop := func(format string, args ...any) {
		rep.fail(format, args...)
		stopped = true
		gone.Add(1)
	}
	if !spec.pool {
		c, err := connect(ctx, true)
		if err != nil {
			stop("client %d connect: %s", cl.id, describe(err))
			return
		}
		cl.conn = c
		defer c.Close(context.Background())
	}
	alive := func() bool {
		if cl.conn != nil && cl.conn.IsClosed() {
			stop("client %d: connection lost", cl.id)
		} else if cl.errs > maxClientErrors && !stopped {
			stop("client %d: stopped after %d failed iterations", cl.id, cl.errs)
		}
		return !stopped
	}
	// Phase 1.
	i := 0
	for ; i < phase1Iters; i++ {
		cl.iterate(ctx, i)
		if !alive() {
			return
		}
	}
	ready.Add(1)
	// Phase 2: keep working until every schema change is seen on this connection.
	for s := 1; s <= 2; s++ {
		deadline := time.Now().Add(2 * stageTimeout)
		for !(int(stage.Load()) >= s && cl.seen >= s) {
			if time.Now().After(deadline) {
				stop("client %d: never read the table's shape after schema change %d", cl.id, s)
				return
			}
			cl.iterate(ctx, i)
			i++
			if !alive() {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		confirmed[s].Add(1)
	}
	// Phase 3: more work, errors and recovery.
	for end := i + phase3Iters; i < end; i++ {
		cl.iterate(ctx, i)
		if !alive() {
			return
		}
	}
	step := func(what string, f func(conn *pgx.Conn) error) {
		if err := cl.with(ctx, f); err != nil {
			rep.fail("client %d %s: %s", cl.id, what, describe(err))
		}
	}
	step("error in transaction", func(c *pgx.Conn) error { return cl.errorInTransaction(ctx, c) })
	step("error in batch", func(c *pgx.Conn) error { return cl.errorInBatch(ctx, c) })
	// Phase 4: cancel and disconnect, on some clients.
	switch cl.id % 10 {
	case 3:
		step("cancel", func(c *pgx.Conn) error { return cl.cancel(ctx, c, false) })
	case 7:
		step("cancel in transaction", func(c *pgx.Conn) error { return cl.cancel(ctx, c, true) })
	}
	switch cl.id % 20 {
	case 5:
		if err := cl.disconnect(ctx, false); err != nil {
			rep.fail("client %d disconnect idle in transaction: %s", cl.id, describe(err))
		}
	case 15:
		if err := cl.disconnect(ctx, true); err != nil {
			rep.fail("client %d disconnect during a query in a transaction: %s", cl.id, describe(err))
		}
	}
	if !alive() {
		return
	}
	// A last iteration after all that, then the read-back through TARGET_URL.
	cl.iterate(ctx, i)
	if cl.broken {
		return
	}
	if err := cl.readBack(ctx); err != nil {
		rep.fail("client %d: %s", cl.id, describe(err))
	}
}

// ---------------------------------------------------------------------------- coordinator

func setup(ctx context.Context) error {
	return directExec(ctx, fmt.Sprintf(`
DROP TABLE IF EXISTS acct, wide, ghost, errtx, lockrow;
CREATE TABLE acct (client int NOT NULL, k int NOT NULL, v bigint NOT NULL, PRIMARY KEY (client, k));
CREATE TABLE wide (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL);
INSERT INTO wide SELECT g, g * 10, 'w' || g FROM generate_series(1, %d) g;
CREATE TABLE ghost (tag text NOT NULL);
CREATE TABLE errtx (client int NOT NULL, note text NOT NULL);
CREATE TABLE lockrow (id int PRIMARY KEY);
INSERT INTO lockrow SELECT g FROM generate_series(0, %d) g;
ANALYZE;`, wideRows, clients))
}

func waitUntil(cond func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

func coordinate(ctx context.Context) {
	n := int64(clients)
	if !waitUntil(func() bool { return ready.Load()+gone.Load() >= n }, 60*time.Second) {
		rep.fail("phase 1: only %d of %d clients finished", ready.Load(), n)
	}
	time.Sleep(300 * time.Millisecond) // clients are running cached statements
	for s, ddl := range []string{
		"ALTER TABLE wide ADD COLUMN c int NOT NULL DEFAULT 7",
		"ALTER TABLE wide ALTER COLUMN a TYPE bigint",
	} {
		t0 := time.Now()
		started.Add(1)
		if err := directExec(ctx, "SET lock_timeout = '15s'; "+ddl); err != nil {
			rep.fail("schema change %q: %s", ddl, describe(err))
		}
		stage.Store(int64(s + 1))
		took := time.Since(t0)
		if !waitUntil(func() bool { return confirmed[s+1].Load()+gone.Load() >= n }, stageTimeout) {
			rep.fail("schema change %d: only %d of %d clients read the new shape within %s", s+1, confirmed[s+1].Load(), n, stageTimeout)
		}
		note("schema change %d took %s, all clients recovered after %s", s+1, took.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	}
}

// finalChecks runs through DIRECT_URL after every client has closed its connections.
func finalChecks(ctx context.Context, cls []*client) {
	c, err := pgx.Connect(ctx, directURL)
	if err != nil {
		rep.fail("final checks: connect to PostgreSQL: %s", describe(err))
		return
	}
	defer c.Close(context.Background())
	type agg struct{ n, s, c int64 }
	got := map[int]agg{}
	rows, err := c.Query(ctx, "SELECT client, count(*), sum(v)::bigint, sum(k::bigint * v)::bigint FROM acct GROUP BY client", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		rep.fail("final checks: %s", describe(err))
		return
	}
	for rows.Next() {
		var id int
		var a agg
		if err := rows.Scan(&id, &a.n, &a.s, &a.c); err != nil {
			rep.fail("final checks: %v", err)
		}
		got[id] = a
	}
	rows.Close()
	bad := 0
	for _, cl := range cls {
		if cl.broken {
			continue
		}
		en, es, ec := cl.expect()
		if g := got[cl.id]; g.n != en || g.s != es || g.c != ec {
			bad++
			if bad <= 3 {
				rep.fail("WRONG RESULT: PostgreSQL holds %d/%d/%d for client %d, want %d/%d/%d", g.n, g.s, g.c, cl.id, en, es, ec)
			}
		}
	}
	if bad > 3 {
		rep.fail("WRONG RESULT: %d clients in all differ", bad)
	}
	var ghosts, errtx int64
	if err := c.QueryRow(ctx, "SELECT (SELECT count(*) FROM ghost), (SELECT count(*) FROM errtx)", pgx.QueryExecModeSimpleProtocol).Scan(&ghosts, &errtx); err != nil {
		rep.fail("final checks: %s", describe(err))
	} else if ghosts != 0 || errtx != 0 {
		rep.fail("WRONG RESULT: %d rows of disconnected clients and %d of failed transactions are visible", ghosts, errtx)
	}
	// No server connection left in a transaction or still running a cancelled query.
	var dirty int64
	var which string
	check := func() bool {
		err := c.QueryRow(ctx, `SELECT count(*), coalesce(string_agg(state || ': ' || left(query, 60), ' / '), '')
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
AND (state LIKE 'idle in transaction%' OR (state = 'active' AND query LIKE '%pg_sleep%'))`, pgx.QueryExecModeSimpleProtocol).Scan(&dirty, &which)
		return err == nil && dirty == 0
	}
	if !waitUntil(check, 5*time.Second) {
		rep.fail("%d server connections left dirty: %s", dirty, which)
	}
}

func main() {
	flag.StringVar(&modeName, "mode", "cache_statement", "cache_statement|cache_describe|describe_exec|exec|simple_protocol|batch|pool|listen")
	version := flag.Bool("version", false, "print the pgx version and exit")
	flag.Parse()
	if *version {
		fmt.Println("pgx", pgxVersion())
		return
	}
	if modeName == "listen" {
		runListen() // listen.go: the driver's listener API, not the load workload
		return
	}
	var ok bool
	if spec, ok = modes[modeName]; !ok {
		names := make([]string, 0, len(modes))
		for k := range modes {
			names = append(names, k)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "unknown -mode %q (one of %s)\n", modeName, strings.Join(names, ", "))
		os.Exit(2)
	}
	clients = 100
	if s := os.Getenv("CLIENTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bad CLIENTS=%q\n", s)
			os.Exit(2)
		}
		clients = n
	}
	targetURL, directURL = os.Getenv("TARGET_URL"), os.Getenv("DIRECT_URL")
	if targetURL == "" || directURL == "" {
		fmt.Fprintln(os.Stderr, "TARGET_URL and DIRECT_URL must be set")
		os.Exit(2)
	}
	go func() {
		time.Sleep(totalDeadline)
		finish(fmt.Sprintf("HANG: scenario still running after %s", totalDeadline))
	}()
	ctx := context.Background()
	if err := setup(ctx); err != nil {
		finish("setup through DIRECT_URL: " + describe(err))
	}
	dcfg, err := pgxpool.ParseConfig(directURL)
	if err != nil {
		finish("DIRECT_URL: " + err.Error())
	}
	dcfg.MaxConns = 4
	dcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	if direct, err = pgxpool.NewWithConfig(ctx, dcfg); err != nil {
		finish("DIRECT_URL: " + describe(err))
	}
	if spec.pool {
		pcfg, err := pgxpool.ParseConfig(targetURL)
		if err != nil {
			finish("pool config: " + err.Error())
		}
		cfg, _ := connConfig(true)
		pcfg.ConnConfig = cfg
		pcfg.MaxConns = int32(clients)
		if pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
			finish("pool: " + describe(err))
		}
	}
	cls := make([]*client, clients)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		cls[c] = &client{id: c, rows: map[int]int64{}}
		wg.Add(1)
		go func(cl *client) {
			defer wg.Done()
			// Every operation of a client shares one deadline, ahead of the watchdog's, so a
			// hang is reported as an error of that client.
			opCtx, cancel := context.WithTimeout(ctx, clientDeadline)
			defer cancel()
			cl.run(opCtx)
		}(cls[c])
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	coordinate(ctx)
	<-done
	if pool != nil {
		pool.Close()
	}
	queuedCancel(ctx)
	finalChecks(ctx, cls)
	finish("")
}
