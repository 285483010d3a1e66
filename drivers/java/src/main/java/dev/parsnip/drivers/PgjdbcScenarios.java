package dev.parsnip.drivers;

import java.net.URI;
import java.sql.BatchUpdateException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;

import org.postgresql.util.PSQLException;

/**
 * pgjdbc driver scenarios for parsnip's driver matrix (see drivers/README.md).
 *
 * <p>{@code java -jar target/pgjdbc-scenarios.jar --mode threshold5|threshold1|threshold0|batch|
 * fetchsize|autosave}. Environment: TARGET_URL (PostgreSQL or parsnip), DIRECT_URL (PostgreSQL
 * itself: setup, schema changes, final checks), CLIENTS (default 100), VIA_PARSNIP. The last
 * line on stdout is one JSON object {"ok","transactions","errors","expected_errors","detail"};
 * the exit code is 0 when ok. Diagnostics go to stderr.
 *
 * <p>CLIENTS threads, each with its own connection, run five phases:
 * <ol>
 *   <li>work: transactions that insert and update the thread's own rows and read them back
 *       (count and sum checked inside the transaction), {@code SELECT * FROM wide} checked
 *       column by column (in the transaction and in autocommit), and churn over 50 distinct
 *       query texts (more than parsnip's per-server cap of 20), four per client so that
 *       pgjdbc's prepareThreshold makes them named server statements;
 *   <li>schema change under load: the coordinator runs {@code ALTER TABLE wide ADD COLUMN c}
 *       through DIRECT_URL while the threads keep working, waits until each has read the new
 *       shape on its own connection, then {@code ALTER TABLE wide ALTER COLUMN a TYPE bigint},
 *       and waits again. Where PostgreSQL makes pgjdbc fail once (0A000 "cached plan must not
 *       change result type" inside a transaction with autosave=never; in autocommit pgjdbc
 *       retries by itself) one such error per connection and change counts as expected;
 *   <li>a failing statement inside a transaction and inside a batch (executeBatch), then
 *       recovery on the same connection, the failed writes invisible;
 *   <li>Statement.cancel() on a running pg_sleep (autocommit and in a transaction), then the
 *       same connection works; connections aborted (Connection.abort: socket closed, no
 *       Terminate) while idle in a transaction holding a row lock and while a query runs:
 *       the lock must become free and their writes must be gone;
 *   <li>read-back of every thread's rows (count, sum, checksum) through TARGET_URL and through
 *       DIRECT_URL; no backend left idle in transaction; and a cancel of a query that waits
 *       for a server connection (eight connections run pg_sleep(2) first).
 * </ol>
 */
public final class PgjdbcScenarios {

    static final int CHURN_TEXTS = 50;
    static final int WIDE_ROWS = 1000;
    static final int PHASE1_ITERS = 12;
    static final int PHASE3_ITERS = 4;
    static final long STAGE_TIMEOUT_MS = 25_000;
    static final long TOTAL_DEADLINE_MS = 100_000;
    static final int MAX_CLIENT_ERRORS = 20;
    static final String WIDE_SQL = "SELECT * FROM wide WHERE id = ?";
    static final String WIDE_RANGE_SQL = "SELECT * FROM wide WHERE id BETWEEN ? AND ? ORDER BY id";

    /** One scenario: connection properties, and how the work is done. */
    record Mode(String name, Map<String, String> props, boolean batch, boolean fetch, boolean expect0A000) {}

    static final Map<String, Mode> MODES = new HashMap<>();

    static {
        // autosave=never (the default): PostgreSQL's 0A000 inside a transaction reaches the
        // application once per connection and change, for statements pgjdbc has named.
        MODES.put("threshold5", new Mode("threshold5", Map.of(), false, false, true));
        MODES.put("threshold1", new Mode("threshold1", Map.of("prepareThreshold", "1"), false, false, true));
        // Never a named statement: PostgreSQL parses every execution afresh, so no 0A000.
        MODES.put("threshold0", new Mode("threshold0", Map.of("prepareThreshold", "0"), false, false, false));
        MODES.put("batch", new Mode("batch", Map.of(), true, false, true));
        MODES.put("fetchsize", new Mode("fetchsize", Map.of(), false, true, true));
        // autosave=conservative: pgjdbc rolls back to its savepoint and retries by itself.
        MODES.put("autosave", new Mode("autosave", Map.of("autosave", "conservative"), false, false, false));
    }

    // ------------------------------------------------------------------------------ report

    static final AtomicLong transactions = new AtomicLong();
    static final AtomicLong queries = new AtomicLong();
    static final AtomicLong errors = new AtomicLong();
    static final AtomicLong expectedErrors = new AtomicLong();
    static final AtomicLong injected = new AtomicLong();
    static final AtomicLong cancels = new AtomicLong();
    static final AtomicLong disconnects = new AtomicLong();
    static final List<String> samples = new ArrayList<>();
    static final Map<String, Long> expectedKinds = new java.util.TreeMap<>();
    static final List<String> notes = new ArrayList<>();
    static final AtomicBoolean printed = new AtomicBoolean();
    static final long startNanos = System.nanoTime();
    static final boolean verbose = System.getenv("DRIVER_VERBOSE") != null;

    static Mode mode;
    static int clients;
    static String targetUrl;
    static String directUrl;
    static Properties targetProps;

    static void fail(String msg) {
        errors.incrementAndGet();
        System.err.println("ERROR: " + msg);
        synchronized (samples) {
            if (samples.size() < 5) {
                samples.add(msg);
            }
        }
    }

    static void note(String msg) {
        synchronized (notes) {
            notes.add(msg);
        }
    }

    static String describe(Throwable e) {
        if (e instanceof WideException w) {
            e = w.getCause();
        }
        if (e instanceof SQLException s) {
            StringBuilder b = new StringBuilder();
            b.append(s.getSQLState()).append(' ').append(s.getMessage().replace('\n', ' '));
            if (s instanceof PSQLException p && p.getServerErrorMessage() != null && p.getServerErrorMessage().getRoutine() != null) {
                b.append(" (").append(p.getServerErrorMessage().getRoutine()).append(')');
            }
            SQLException next = s.getNextException();
            if (next != null && next != s) {
                b.append(" / next: ").append(next.getSQLState()).append(' ').append(next.getMessage().replace('\n', ' '));
            }
            return b.toString();
        }
        return e.toString();
    }

    static String sqlstate(Throwable e) {
        while (e != null) {
            if (e instanceof BatchUpdateException b && b.getNextException() != null) {
                return b.getNextException().getSQLState();
            }
            if (e instanceof SQLException s && s.getSQLState() != null) {
                return s.getSQLState();
            }
            e = e.getCause();
        }
        return "";
    }

    static synchronized void finish(String fatal) {
        if (!printed.compareAndSet(false, true)) {
            return;
        }
        if (fatal != null) {
            fail(fatal);
        }
        long errs = errors.get();
        String detail = String.format(Locale.ROOT,
                "pgjdbc %s mode=%s clients=%d via_parsnip=%s %.1fs: txns=%d queries=%d injected-errors-ok=%d cancels=%d disconnects=%d",
                driverVersion(), mode == null ? "?" : mode.name(), clients, System.getenv("VIA_PARSNIP"),
                (System.nanoTime() - startNanos) / 1e9, transactions.get(), queries.get(), injected.get(), cancels.get(),
                disconnects.get());
        synchronized (notes) {
            if (!notes.isEmpty()) {
                detail += "; " + String.join("; ", notes);
            }
        }
        synchronized (samples) {
            if (!samples.isEmpty()) {
                detail += "; first errors: " + String.join(" | ", samples);
            }
        }
        StringBuilder kinds = new StringBuilder("{");
        synchronized (expectedKinds) {
            for (Map.Entry<String, Long> e : expectedKinds.entrySet()) {
                kinds.append(kinds.length() > 1 ? ", " : "").append(json(e.getKey())).append(": ").append(e.getValue());
            }
        }
        kinds.append('}');
        System.out.println("{\"ok\": " + (errs == 0) + ", \"transactions\": " + transactions.get() + ", \"errors\": " + errs
                + ", \"expected_errors\": " + expectedErrors.get() + ", \"expected_kinds\": " + kinds + ", \"detail\": "
                + json(detail) + "}");
        System.out.flush();
        Runtime.getRuntime().halt(errs == 0 ? 0 : 1);
    }

    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }

    static String driverVersion() {
        return org.postgresql.util.DriverInfo.DRIVER_VERSION;
    }

    // ------------------------------------------------------------------------------ shared state

    static final AtomicInteger stage = new AtomicInteger(); // schema changes committed
    static final AtomicInteger started = new AtomicInteger(); // schema changes begun
    static final AtomicInteger ready = new AtomicInteger();
    static final AtomicInteger[] confirmed = {new AtomicInteger(), new AtomicInteger(), new AtomicInteger()};
    static final AtomicInteger gone = new AtomicInteger();
    static final Map<Connection, Integer> allowance = new IdentityHashMap<>();

    /** An error of a statement reading table wide (the only ones a schema change may break). */
    static final class WideException extends Exception {
        WideException(SQLException cause) {
            super(cause);
        }
    }

    /** A wrong result, a shape mismatch: always an error. */
    static final class Wrong extends Exception {
        Wrong(String msg) {
            super("WRONG RESULT: " + msg);
        }
    }

    static void classify(Connection conn, String what, Exception e) {
        String code = sqlstate(e);
        if (e instanceof WideException && mode.expect0A000() && code.equals("0A000")) {
            boolean ok;
            synchronized (allowance) {
                int used = allowance.getOrDefault(conn, 0);
                ok = used < started.get();
                if (ok) {
                    allowance.put(conn, used + 1);
                }
            }
            if (ok) {
                expectedErrors.incrementAndGet();
                synchronized (expectedKinds) {
                    expectedKinds.merge(code, 1L, Long::sum);
                }
                if (verbose) {
                    System.err.println("expected: " + what + ": " + describe(e));
                }
                return;
            }
            fail(what + ": " + describe(e) + " (more than one per connection and schema change)");
            return;
        }
        fail(what + ": " + describe(e));
    }

    // ------------------------------------------------------------------------------ connections

    /** postgres://user[:pw]@host:port/db?k=v → jdbc:postgresql://host:port/db, user in props. */
    static String jdbcUrl(String url, Properties props) {
        URI u = URI.create(url);
        String ui = u.getUserInfo();
        if (ui != null) {
            String[] parts = ui.split(":", 2);
            props.setProperty("user", parts[0]);
            if (parts.length > 1) {
                props.setProperty("password", parts[1]);
            }
        }
        String db = u.getPath() == null || u.getPath().length() <= 1 ? "postgres" : u.getPath().substring(1);
        int port = u.getPort() < 0 ? 5432 : u.getPort();
        return "jdbc:postgresql://" + u.getHost() + ":" + port + "/" + db;
    }

    static Connection connectTarget() throws SQLException {
        return DriverManager.getConnection(targetUrl, targetProps);
    }

    static Connection connectDirect() throws SQLException {
        Properties p = new Properties();
        String url = jdbcUrl(System.getenv("DIRECT_URL"), p);
        p.setProperty("socketTimeout", "60");
        return DriverManager.getConnection(url, p);
    }

    // ------------------------------------------------------------------------------ one client

    final int id;
    Connection conn;
    final Map<Integer, Long> rows = new HashMap<>();
    int nextK;
    int seen; // newest wide shape read
    boolean broken;
    int myErrors; // errors this client counted; past MAX_CLIENT_ERRORS it stops

    PgjdbcScenarios(int id) {
        this.id = id;
    }

    long[] expect() {
        long n = 0, sum = 0, check = 0;
        for (Map.Entry<Integer, Long> e : rows.entrySet()) {
            n++;
            sum += e.getValue();
            check += (long) e.getKey() * e.getValue();
        }
        return new long[] {n, sum, check};
    }

    /** Shape of one wide row: 0 (id,a,b), 1 (c added), 2 (a is bigint); checks the values. */
    static int checkWide(ResultSet rs, int id) throws SQLException, Wrong {
        ResultSetMetaData md = rs.getMetaData();
        StringBuilder names = new StringBuilder();
        for (int i = 1; i <= md.getColumnCount(); i++) {
            names.append(i > 1 ? "," : "").append(md.getColumnName(i));
        }
        int shape;
        switch (names.toString()) {
            case "id,a,b" -> shape = 0;
            case "id,a,b,c" -> shape = 1;
            default -> throw new Wrong("wide: unexpected columns " + names);
        }
        Object vid = rs.getObject(1), a = rs.getObject(2), b = rs.getObject(3);
        if (!(vid instanceof Integer i) || i != id) {
            throw new Wrong("wide id " + id + ": id = " + vid);
        }
        if (a instanceof Integer ai) {
            if (ai != id * 10) {
                throw new Wrong("wide id " + id + ": a = " + a);
            }
        } else if (a instanceof Long al) {
            if (al != id * 10L) {
                throw new Wrong("wide id " + id + ": a = " + a);
            }
            if (shape != 1) {
                throw new Wrong("wide id " + id + ": a is bigint but c is missing");
            }
            shape = 2;
        } else {
            throw new Wrong("wide id " + id + ": a = " + a + " (" + (a == null ? "null" : a.getClass().getSimpleName()) + ")");
        }
        if (!("w" + id).equals(b)) {
            throw new Wrong("wide id " + id + ": b = " + b);
        }
        if (shape >= 1) {
            Object c = rs.getObject(4);
            if (!(c instanceof Integer ci) || ci != 7) {
                throw new Wrong("wide id " + id + ": c = " + c);
            }
        }
        return shape;
    }

    /** Reads wide rows [from, to] (one row when equal); with fetchSize as a cursor. */
    void readWide(int from, int to) throws Exception {
        int st = stage.get();
        queries.incrementAndGet();
        String sql = from == to ? WIDE_SQL : WIDE_RANGE_SQL;
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setInt(1, from);
            if (from != to) {
                ps.setInt(2, to);
                ps.setFetchSize(10);
            }
            int got = 0;
            ResultSet rs;
            try {
                rs = ps.executeQuery();
            } catch (SQLException e) {
                throw new WideException(e);
            }
            try (rs) {
                while (true) {
                    boolean more;
                    try {
                        more = rs.next();
                    } catch (SQLException e) {
                        throw new WideException(e);
                    }
                    if (!more) {
                        break;
                    }
                    int shape = checkWide(rs, from + got);
                    got++;
                    if (shape < st) {
                        throw new Wrong("stale result shape: saw " + shape + " schema changes, " + st + " committed before the query");
                    }
                    seen = Math.max(seen, shape);
                }
            }
            if (got != to - from + 1) {
                throw new Wrong("wide " + from + ".." + to + ": " + got + " rows");
            }
        }
    }

    static String churnSql(int j) {
        return "SELECT ?::int + " + j + " AS r, count(*) AS n FROM acct WHERE client = ?";
    }

    void iterate(int i) {
        for (int attempt = 0; attempt < 3; attempt++) {
            try {
                work(i);
                return;
            } catch (Exception e) {
                try {
                    if (!conn.isClosed() && !conn.getAutoCommit()) {
                        conn.rollback();
                    }
                    conn.setAutoCommit(true);
                } catch (SQLException ignored) {
                    // the next statement reports it
                }
                long before = errors.get();
                classify(conn, "client " + id + " iteration " + i, e);
                if (errors.get() != before || isClosed()) {
                    myErrors++;
                    return;
                }
            }
        }
        fail("client " + id + " iteration " + i + ": still failing after retries");
    }

    boolean isClosed() {
        try {
            return conn.isClosed();
        } catch (SQLException e) {
            return true;
        }
    }

    /** One unit of work: a read-write transaction with read-back, then autocommit reads. */
    void work(int i) throws Exception {
        int k = nextK;
        int n = mode.batch() ? 3 : 1; // rows inserted
        int uk = k / 2;
        long delta = k % 7 + 1;
        conn.setAutoCommit(false);
        if (mode.batch()) {
            try (PreparedStatement ps = conn.prepareStatement("INSERT INTO acct (client, k, v) VALUES (?, ?, ?)")) {
                for (int x = 0; x < n; x++) {
                    ps.setInt(1, id);
                    ps.setInt(2, k + x);
                    ps.setLong(3, id * 1000L + k + x);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                for (int c : counts) {
                    if (c != 1 && c != Statement.SUCCESS_NO_INFO) {
                        throw new Wrong("batch insert counts " + java.util.Arrays.toString(counts));
                    }
                }
            }
            try (PreparedStatement ps = conn.prepareStatement("UPDATE acct SET v = v + ? WHERE client = ? AND k = ?")) {
                for (int x = 0; x < 2; x++) {
                    ps.setLong(1, delta + x);
                    ps.setInt(2, id);
                    ps.setInt(3, uk + x);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                if (counts.length != 2 || counts[0] != 1 || counts[1] != 1) {
                    throw new Wrong("batch update counts " + java.util.Arrays.toString(counts));
                }
            }
            queries.addAndGet(5);
        } else {
            try (PreparedStatement ps = conn.prepareStatement("INSERT INTO acct (client, k, v) VALUES (?, ?, ?)")) {
                ps.setInt(1, id);
                ps.setInt(2, k);
                ps.setLong(3, id * 1000L + k);
                if (ps.executeUpdate() != 1) {
                    throw new Wrong("insert count");
                }
            }
            try (PreparedStatement ps = conn.prepareStatement("UPDATE acct SET v = v + ? WHERE client = ? AND k = ?")) {
                ps.setLong(1, delta);
                ps.setInt(2, id);
                ps.setInt(3, uk);
                int c = ps.executeUpdate();
                if (c != 1) {
                    throw new Wrong("update affected " + c + " rows");
                }
            }
            queries.addAndGet(2);
        }
        // What the transaction should see now.
        Map<Integer, Long> after = new HashMap<>(rows);
        for (int x = 0; x < n; x++) {
            after.put(k + x, id * 1000L + k + x);
        }
        after.merge(uk, delta, Long::sum);
        if (mode.batch()) {
            after.merge(uk + 1, delta + 1, Long::sum);
        }
        long en = after.size(), es = 0, ec = 0;
        for (Map.Entry<Integer, Long> e : after.entrySet()) {
            es += e.getValue();
            ec += (long) e.getKey() * e.getValue();
        }
        queries.incrementAndGet();
        if (mode.fetch() && i % 2 == 0) {
            // A cursor over the client's rows, in chunks of 10.
            try (PreparedStatement ps = conn.prepareStatement("SELECT k, v FROM acct WHERE client = ? ORDER BY k")) {
                ps.setInt(1, id);
                ps.setFetchSize(10);
                long gn = 0, gs = 0, gc = 0;
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        gn++;
                        gs += rs.getLong(2);
                        gc += rs.getLong(1) * rs.getLong(2);
                    }
                }
                if (gn != en || gs != es || gc != ec) {
                    throw new Wrong("cursor read-back in transaction: " + gn + "/" + gs + "/" + gc + ", want " + en + "/" + es + "/" + ec);
                }
            }
        } else {
            try (PreparedStatement ps = conn.prepareStatement("SELECT count(*), coalesce(sum(v), 0)::bigint FROM acct WHERE client = ?")) {
                ps.setInt(1, id);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    if (rs.getLong(1) != en || rs.getLong(2) != es) {
                        throw new Wrong("read-back in transaction: " + rs.getLong(1) + "/" + rs.getLong(2) + ", want " + en + "/" + es);
                    }
                }
            }
        }
        if (mode.fetch()) {
            // A cursor over 25 rows of wide (the table the schema changes alter).
            int from = (id * 7 + i) % (WIDE_ROWS - 40) + 1;
            readWide(from, from + 24);
        } else {
            int wid = (id * 7 + i) % WIDE_ROWS + 1;
            readWide(wid, wid);
        }
        try {
            conn.commit();
        } catch (SQLException e) {
            broken = true;
            throw e;
        }
        conn.setAutoCommit(true);
        rows.clear();
        rows.putAll(after);
        nextK += n;
        transactions.incrementAndGet();
        // Autocommit: a churn text (four per client, so that each is used often enough for
        // prepareThreshold; all 50 across the clients), and the wide query again.
        int j = (id + (i % 4) * 7) % CHURN_TEXTS;
        queries.incrementAndGet();
        try (PreparedStatement ps = conn.prepareStatement(churnSql(j))) {
            ps.setInt(1, id);
            ps.setInt(2, id);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                if (rs.getLong(1) != id + j || rs.getLong(2) != rows.size()) {
                    throw new Wrong("churn " + j + ": " + rs.getLong(1) + "/" + rs.getLong(2) + ", want " + (id + j) + "/" + rows.size());
                }
            }
        }
        int wid = (id * 13 + i) % WIDE_ROWS + 1;
        readWide(wid, wid);
    }

    // ------------------------------------------------------------------------------ phase 3, 4

    long countErrtx(String... notes) throws SQLException {
        queries.incrementAndGet();
        try (PreparedStatement ps = conn.prepareStatement("SELECT count(*) FROM errtx WHERE client = ? AND note = ANY (?)")) {
            ps.setInt(1, id);
            ps.setArray(2, conn.createArrayOf("text", notes));
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    void recovered(String after, String... notes) throws Exception {
        long n = countErrtx(notes);
        if (n != 0) {
            throw new Wrong("after " + after + ": " + n + " rows of the failed writes are visible");
        }
    }

    void expectState(Exception e, String want, String what) throws Wrong {
        if (!sqlstate(e).equals(want)) {
            throw new Wrong(what + ": got " + describe(e) + ", want " + want);
        }
    }

    void errorInTransaction() throws Exception {
        conn.setAutoCommit(false);
        try (PreparedStatement ps = conn.prepareStatement("INSERT INTO errtx (client, note) VALUES (?, ?)")) {
            ps.setInt(1, id);
            ps.setString(2, "tx");
            ps.executeUpdate();
        }
        try (PreparedStatement ps = conn.prepareStatement("SELECT 1 / ?::int")) {
            ps.setInt(1, 0);
            ps.executeQuery().close();
            throw new Wrong("error in transaction: 1/0 succeeded");
        } catch (SQLException e) {
            expectState(e, "22012", "error in transaction");
        }
        try (PreparedStatement ps = conn.prepareStatement("SELECT ?::int")) {
            ps.setInt(1, 1);
            ps.executeQuery().close();
            throw new Wrong("statement after the error succeeded");
        } catch (SQLException e) {
            expectState(e, "25P02", "statement after the error");
        }
        conn.rollback();
        conn.setAutoCommit(true);
        injected.addAndGet(2);
        recovered("error in transaction", "tx");
    }

    /** A failing row in the middle of executeBatch, in a transaction and in autocommit. */
    void errorInBatch(boolean autocommit) throws Exception {
        String note = autocommit ? "batch-ac" : "batch";
        conn.setAutoCommit(autocommit);
        try (PreparedStatement ps = conn.prepareStatement("INSERT INTO errtx (client, note) VALUES (?, ?)")) {
            for (String n : new String[] {note, null, note}) {
                ps.setInt(1, id);
                ps.setString(2, n);
                ps.addBatch();
            }
            ps.executeBatch();
            throw new Wrong("batch with a NULL in a NOT NULL column succeeded");
        } catch (BatchUpdateException e) {
            expectState(e, "23502", "error in batch");
        }
        if (!autocommit) {
            conn.rollback();
            conn.setAutoCommit(true);
        }
        injected.incrementAndGet();
        // A working batch on the same connection.
        try (PreparedStatement ps = conn.prepareStatement("UPDATE lockrow SET id = id WHERE id = ?")) {
            for (int x = 0; x < 3; x++) {
                ps.setInt(1, id);
                ps.addBatch();
            }
            int[] counts = ps.executeBatch();
            if (counts.length != 3 || counts[0] != 1 || counts[1] != 1 || counts[2] != 1) {
                throw new Wrong("batch after the failed batch: " + java.util.Arrays.toString(counts));
            }
        }
        recovered(autocommit ? "error in an autocommit batch" : "error in a batch in a transaction", note);
    }

    /** Statement.cancel() on a running pg_sleep; the same connection must then work. */
    void cancel(boolean inTx, Connection direct) throws Exception {
        String sql = "SELECT pg_sleep(?) /* cancel c" + id + " */";
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setDouble(1, 0);
            ps.executeQuery().close();
        }
        conn.setAutoCommit(!inTx);
        if (inTx) {
            try (PreparedStatement ps = conn.prepareStatement("INSERT INTO errtx (client, note) VALUES (?, ?)")) {
                ps.setInt(1, id);
                ps.setString(2, "cancel");
                ps.executeUpdate();
            }
        }
        ExecutorService ex = Executors.newSingleThreadExecutor();
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setDouble(1, 10);
            Future<Exception> res = ex.submit(() -> {
                try {
                    ps.executeQuery().close();
                    return null;
                } catch (Exception e) {
                    return e;
                }
            });
            waitRunning(direct, "/* cancel c" + id + " */", res);
            long t0 = System.nanoTime();
            ps.cancel();
            Exception e;
            try {
                e = res.get(8, TimeUnit.SECONDS);
            } catch (java.util.concurrent.TimeoutException te) {
                throw new Wrong("cancel: no answer 8 s after Statement.cancel()");
            }
            long tookMs = (System.nanoTime() - t0) / 1_000_000;
            if (e == null) {
                throw new Wrong("cancel: pg_sleep(10) was not cancelled");
            }
            expectState(e, "57014", "cancel");
            if (tookMs > 4000) {
                throw new Wrong("cancel took " + tookMs + " ms");
            }
        } finally {
            ex.shutdownNow();
        }
        if (inTx) {
            conn.rollback();
        }
        conn.setAutoCommit(true);
        cancels.incrementAndGet();
        try (PreparedStatement ps = conn.prepareStatement("SELECT ?::int + 1")) {
            ps.setInt(1, 41);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                if (rs.getInt(1) != 42) {
                    throw new Wrong("query after cancel");
                }
            }
        }
        recovered("cancel", "cancel");
    }

    /** Waits until PostgreSQL shows a query containing marker running for 200 ms. */
    static void waitRunning(Connection direct, String marker, Future<Exception> res) throws Exception {
        long deadline = System.nanoTime() + 20_000_000_000L;
        while (System.nanoTime() < deadline) {
            synchronized (direct) {
                try (PreparedStatement ps = direct.prepareStatement(
                        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() "
                        + "AND position(? in query) > 0 AND now() - query_start > interval '200 ms'")) {
                    ps.setString(1, marker);
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        if (rs.getLong(1) > 0) {
                            return;
                        }
                    }
                }
            }
            if (res.isDone()) {
                throw new Wrong("query ended before it was cancelled: " + (res.get() == null ? "ok" : describe(res.get())));
            }
            Thread.sleep(20);
        }
        throw new Wrong("query not running on PostgreSQL after 20 s");
    }

    /**
     * A second connection takes a row lock and writes in a transaction, then is aborted
     * (Connection.abort closes the socket, no Terminate), idle or while pg_sleep runs. The lock
     * must become free and the write must be gone.
     */
    void disconnect(boolean midQuery) throws Exception {
        String tag = "c" + id + "-" + midQuery;
        Connection d = connectTarget();
        d.setAutoCommit(false);
        try (PreparedStatement ps = d.prepareStatement("INSERT INTO ghost (tag) VALUES (?)")) {
            ps.setString(1, tag);
            ps.executeUpdate();
        }
        try (PreparedStatement ps = d.prepareStatement("SELECT id FROM lockrow WHERE id = ? FOR UPDATE")) {
            ps.setInt(1, id);
            ps.executeQuery().close();
        }
        ExecutorService ex = Executors.newSingleThreadExecutor();
        try {
            if (midQuery) {
                Future<?> f = ex.submit(() -> {
                    try (PreparedStatement ps = d.prepareStatement("SELECT pg_sleep(?)")) {
                        ps.setDouble(1, 3);
                        ps.executeQuery().close();
                    } catch (SQLException ignored) {
                        // the connection is aborted under it
                    }
                });
                Thread.sleep(300);
                d.abort(Runnable::run);
                f.get(10, TimeUnit.SECONDS);
            } else {
                d.abort(Runnable::run);
            }
        } finally {
            ex.shutdownNow();
        }
        disconnects.incrementAndGet();
        long t0 = System.nanoTime();
        conn.setAutoCommit(false);
        try (Statement s = conn.createStatement()) {
            s.execute("SET LOCAL lock_timeout = '10s'");
        }
        try (PreparedStatement ps = conn.prepareStatement("SELECT id FROM lockrow WHERE id = ? FOR UPDATE")) {
            ps.setInt(1, id);
            ps.executeQuery().close();
        } catch (SQLException e) {
            throw new Wrong("row lock of the aborted connection (after " + (System.nanoTime() - t0) / 1_000_000 + " ms): " + describe(e));
        }
        conn.commit();
        conn.setAutoCommit(true);
        try (PreparedStatement ps = conn.prepareStatement("SELECT count(*) FROM ghost WHERE tag = ?")) {
            ps.setString(1, tag);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                if (rs.getLong(1) != 0) {
                    throw new Wrong("the aborted connection's write is visible");
                }
            }
        }
    }

    void readBack() throws Exception {
        queries.incrementAndGet();
        try (PreparedStatement ps = conn.prepareStatement(
                "SELECT count(*), coalesce(sum(v), 0)::bigint, coalesce(sum(k::bigint * v), 0)::bigint FROM acct WHERE client = ?")) {
            ps.setInt(1, id);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                long[] e = expect();
                if (rs.getLong(1) != e[0] || rs.getLong(2) != e[1] || rs.getLong(3) != e[2]) {
                    throw new Wrong("read-back: " + rs.getLong(1) + "/" + rs.getLong(2) + "/" + rs.getLong(3) + ", want " + e[0] + "/" + e[1] + "/" + e[2]);
                }
            }
        }
    }

    interface Step {
        void run() throws Exception;
    }

    void step(String what, Step s) {
        try {
            s.run();
        } catch (Exception e) {
            fail("client " + id + " " + what + ": " + (e instanceof Wrong ? e.getMessage() : describe(e)));
            try {
                if (!conn.getAutoCommit()) {
                    conn.rollback();
                }
                conn.setAutoCommit(true);
            } catch (SQLException ignored) {
                // reported by the next step
            }
        }
    }

    boolean alive() {
        if (isClosed()) {
            fail("client " + id + ": connection lost");
            gone.incrementAndGet();
            return false;
        }
        if (myErrors > MAX_CLIENT_ERRORS) {
            fail("client " + id + ": stopped after " + myErrors + " failed iterations");
            gone.incrementAndGet();
            return false;
        }
        return true;
    }

    void run(Connection direct) {
        try {
            conn = connectTarget();
        } catch (SQLException e) {
            fail("client " + id + " connect: " + describe(e));
            gone.incrementAndGet();
            return;
        }
        try {
            int i = 0;
            for (; i < PHASE1_ITERS; i++) {
                iterate(i);
                if (!alive()) {
                    return;
                }
            }
            ready.incrementAndGet();
            for (int s = 1; s <= 2; s++) {
                long deadline = System.nanoTime() + 2 * STAGE_TIMEOUT_MS * 1_000_000;
                while (!(stage.get() >= s && seen >= s)) {
                    if (System.nanoTime() > deadline) {
                        fail("client " + id + ": never read the table's shape after schema change " + s);
                        gone.incrementAndGet();
                        return;
                    }
                    iterate(i++);
                    if (!alive()) {
                        return;
                    }
                    Thread.sleep(2);
                }
                confirmed[s].incrementAndGet();
            }
            for (int end = i + PHASE3_ITERS; i < end; i++) {
                iterate(i);
                if (!alive()) {
                    return;
                }
            }
            step("error in transaction", this::errorInTransaction);
            step("error in batch", () -> errorInBatch(false));
            step("error in autocommit batch", () -> errorInBatch(true));
            switch (id % 10) {
                case 3 -> step("cancel", () -> cancel(false, direct));
                case 7 -> step("cancel in transaction", () -> cancel(true, direct));
                default -> { }
            }
            switch (id % 20) {
                case 5 -> step("disconnect idle in transaction", () -> disconnect(false));
                case 15 -> step("disconnect during a query in a transaction", () -> disconnect(true));
                default -> { }
            }
            if (!alive()) {
                return;
            }
            iterate(i);
            if (!broken) {
                step("read-back", this::readBack);
            }
        } catch (InterruptedException e) {
            fail("client " + id + " interrupted");
        } finally {
            try {
                conn.close();
            } catch (SQLException ignored) {
                // closing
            }
        }
    }

    // ------------------------------------------------------------------------------ coordinator

    static void setup() throws SQLException {
        try (Connection c = connectDirect(); Statement s = c.createStatement()) {
            s.execute("DROP TABLE IF EXISTS acct, wide, ghost, errtx, lockrow");
            s.execute("CREATE TABLE acct (client int NOT NULL, k int NOT NULL, v bigint NOT NULL, PRIMARY KEY (client, k))");
            s.execute("CREATE TABLE wide (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL)");
            s.execute("INSERT INTO wide SELECT g, g * 10, 'w' || g FROM generate_series(1, " + WIDE_ROWS + ") g");
            s.execute("CREATE TABLE ghost (tag text NOT NULL)");
            s.execute("CREATE TABLE errtx (client int NOT NULL, note text NOT NULL)");
            s.execute("CREATE TABLE lockrow (id int PRIMARY KEY)");
            s.execute("INSERT INTO lockrow SELECT g FROM generate_series(0, " + clients + ") g");
            s.execute("ANALYZE");
        }
    }

    static boolean waitUntil(BooleanSupplier cond, long timeoutMs) throws InterruptedException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000;
        while (System.nanoTime() < deadline) {
            if (cond.getAsBoolean()) {
                return true;
            }
            Thread.sleep(20);
        }
        return cond.getAsBoolean();
    }

    static void coordinate() throws InterruptedException {
        if (!waitUntil(() -> ready.get() + gone.get() >= clients, 60_000)) {
            fail("phase 1: only " + ready.get() + " of " + clients + " clients finished");
        }
        Thread.sleep(300);
        String[] ddls = {"ALTER TABLE wide ADD COLUMN c int NOT NULL DEFAULT 7", "ALTER TABLE wide ALTER COLUMN a TYPE bigint"};
        for (int s = 1; s <= 2; s++) {
            long t0 = System.nanoTime();
            started.incrementAndGet();
            try (Connection c = connectDirect(); Statement st = c.createStatement()) {
                st.execute("SET lock_timeout = '15s'");
                st.execute(ddls[s - 1]);
            } catch (SQLException e) {
                fail("schema change " + ddls[s - 1] + ": " + describe(e));
            }
            stage.set(s);
            long took = (System.nanoTime() - t0) / 1_000_000;
            final int fs = s;
            if (!waitUntil(() -> confirmed[fs].get() + gone.get() >= clients, STAGE_TIMEOUT_MS)) {
                fail("schema change " + s + ": only " + confirmed[s].get() + " of " + clients + " clients read the new shape within "
                        + STAGE_TIMEOUT_MS / 1000 + " s");
            }
            note("schema change " + s + " took " + took + " ms, all clients recovered after " + (System.nanoTime() - t0) / 1_000_000 + " ms");
        }
    }

    /**
     * Statement.cancel() on a query that waits for a server connection: eight connections run
     * pg_sleep(2) (through parsnip they hold every server connection of a pool of up to eight),
     * then one more runs pg_sleep(10) and is cancelled 500 ms later. PostgreSQL ends it with
     * 57014 at once; so must a pooler.
     */
    static void queuedCancel() throws Exception {
        ExecutorService ex = Executors.newFixedThreadPool(9);
        try (Connection v = connectTarget()) {
            String sql = "SELECT pg_sleep(?) /* queued cancel */";
            try (PreparedStatement ps = v.prepareStatement(sql)) {
                ps.setDouble(1, 0);
                ps.executeQuery().close();
            }
            List<Future<?>> holders = new ArrayList<>();
            for (int h = 0; h < 8; h++) {
                holders.add(ex.submit(() -> {
                    try (Connection c = connectTarget(); PreparedStatement ps = c.prepareStatement("SELECT pg_sleep(?)")) {
                        ps.setDouble(1, 2);
                        ps.executeQuery().close();
                    } catch (SQLException e) {
                        fail("queued cancel: holder: " + describe(e));
                    }
                }));
            }
            Thread.sleep(300);
            try (PreparedStatement ps = v.prepareStatement(sql)) {
                ps.setDouble(1, 10);
                Future<Exception> res = ex.submit(() -> {
                    try {
                        ps.executeQuery().close();
                        return null;
                    } catch (Exception e) {
                        return e;
                    }
                });
                Thread.sleep(500);
                long t0 = System.nanoTime();
                ps.cancel();
                Exception e;
                try {
                    e = res.get(15, TimeUnit.SECONDS);
                } catch (java.util.concurrent.TimeoutException te) {
                    fail("queued cancel: no answer 15 s after Statement.cancel()");
                    return;
                }
                long tookMs = (System.nanoTime() - t0) / 1_000_000;
                if (e == null) {
                    fail("queued cancel: the cancel was lost: pg_sleep(10) ran to completion, " + tookMs + " ms after Statement.cancel()");
                } else if (!sqlstate(e).equals("57014")) {
                    fail("queued cancel: got " + describe(e) + ", want 57014");
                } else if (tookMs > 4000) {
                    fail("queued cancel: 57014 only " + tookMs + " ms after Statement.cancel()");
                } else {
                    cancels.incrementAndGet();
                    note("queued cancel answered 57014 after " + tookMs + " ms");
                }
            }
            for (Future<?> f : holders) {
                f.get(20, TimeUnit.SECONDS);
            }
        } finally {
            ex.shutdownNow();
        }
    }

    static void finalChecks(List<PgjdbcScenarios> cls) {
        try (Connection c = connectDirect(); Statement s = c.createStatement()) {
            Map<Integer, long[]> got = new HashMap<>();
            try (ResultSet rs = s.executeQuery("SELECT client, count(*), sum(v)::bigint, sum(k::bigint * v)::bigint FROM acct GROUP BY client")) {
                while (rs.next()) {
                    got.put(rs.getInt(1), new long[] {rs.getLong(2), rs.getLong(3), rs.getLong(4)});
                }
            }
            int bad = 0;
            for (PgjdbcScenarios cl : cls) {
                if (cl.broken) {
                    continue;
                }
                long[] e = cl.expect();
                long[] g = got.getOrDefault(cl.id, new long[3]);
                if (g[0] != e[0] || g[1] != e[1] || g[2] != e[2]) {
                    if (++bad <= 3) {
                        fail("WRONG RESULT: PostgreSQL holds " + g[0] + "/" + g[1] + "/" + g[2] + " for client " + cl.id + ", want " + e[0] + "/" + e[1] + "/" + e[2]);
                    }
                }
            }
            if (bad > 3) {
                fail("WRONG RESULT: " + bad + " clients in all differ");
            }
            try (ResultSet rs = s.executeQuery("SELECT (SELECT count(*) FROM ghost), (SELECT count(*) FROM errtx)")) {
                rs.next();
                if (rs.getLong(1) != 0 || rs.getLong(2) != 0) {
                    fail("WRONG RESULT: " + rs.getLong(1) + " rows of aborted connections and " + rs.getLong(2) + " of failed transactions are visible");
                }
            }
            String[] which = {""};
            boolean clean = waitUntil(() -> {
                try (ResultSet rs = s.executeQuery("SELECT count(*), coalesce(string_agg(state || ': ' || left(query, 60), ' / '), '') "
                        + "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        + "AND (state LIKE 'idle in transaction%' OR (state = 'active' AND query LIKE '%pg_sleep%'))")) {
                    rs.next();
                    which[0] = rs.getLong(1) + " server connections left dirty: " + rs.getString(2);
                    return rs.getLong(1) == 0;
                } catch (SQLException e) {
                    which[0] = describe(e);
                    return false;
                }
            }, 5000);
            if (!clean) {
                fail(which[0]);
            }
        } catch (Exception e) {
            fail("final checks: " + describe(e));
        }
    }

    public static void main(String[] args) throws Exception {
        String modeName = "threshold5";
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--version" -> {
                    System.out.println("pgjdbc " + driverVersion());
                    return;
                }
                case "--mode" -> modeName = args[++i];
                default -> {
                    System.err.println("usage: --mode " + String.join("|", MODES.keySet()) + " | --version");
                    System.exit(2);
                }
            }
        }
        mode = MODES.get(modeName);
        if (mode == null) {
            System.err.println("unknown --mode " + modeName + " (one of " + String.join(", ", MODES.keySet()) + ")");
            System.exit(2);
        }
        clients = Integer.parseInt(System.getenv().getOrDefault("CLIENTS", "100"));
        if (System.getenv("TARGET_URL") == null || System.getenv("DIRECT_URL") == null) {
            System.err.println("TARGET_URL and DIRECT_URL must be set");
            System.exit(2);
        }
        targetProps = new Properties();
        targetUrl = jdbcUrl(System.getenv("TARGET_URL"), targetProps);
        targetProps.putAll(mode.props());
        targetProps.setProperty("socketTimeout", "60"); // a hang becomes an error, not a stuck thread
        directUrl = jdbcUrl(System.getenv("DIRECT_URL"), new Properties());

        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(TOTAL_DEADLINE_MS);
                finish("HANG: scenario still running after " + TOTAL_DEADLINE_MS / 1000 + " s");
            } catch (InterruptedException ignored) {
                // finished in time
            }
        });
        watchdog.setDaemon(true);
        watchdog.start();

        try {
            setup();
        } catch (SQLException e) {
            finish("setup through DIRECT_URL: " + describe(e));
        }
        List<PgjdbcScenarios> cls = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        try (Connection direct = connectDirect()) {
            CountDownLatch done = new CountDownLatch(clients);
            for (int c = 0; c < clients; c++) {
                PgjdbcScenarios cl = new PgjdbcScenarios(c);
                cls.add(cl);
                Thread t = new Thread(() -> {
                    try {
                        cl.run(direct);
                    } finally {
                        done.countDown();
                    }
                }, "client-" + c);
                t.setDaemon(true);
                threads.add(t);
                t.start();
            }
            coordinate();
            done.await();
        }
        queuedCancel();
        finalChecks(cls);
        finish(null);
    }
}
