package dev.parsnip.drivers;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;

/**
 * pgjdbc's own listener API through parsnip (issue 27): {@code
 * PGConnection.getNotifications(timeoutMillis)}.
 *
 * <p>{@code java -cp target/pgjdbc-scenarios.jar dev.parsnip.drivers.ListenScenario}: a
 * listener connection LISTENs on {@code ln_plain} and on the quoted mixed-case {@code
 * "Ln_MiXed"}; a second connection sends NOTIFYs: plain, non-ASCII and empty payloads,
 * pg_notify() with parameters, a transaction that rolls back and one that commits
 * (autocommit off), and one on {@code ln_mixed} (the folded name: not the listener's). The
 * listener must get exactly the committed ones of its channels, in order, channel names and
 * payloads byte for byte. Then it UNLISTENs {@code "Ln_MiXed"} and must not get that
 * channel's next one. Every wait is bounded by getNotifications' timeout. The result line
 * follows drivers/README.md's contract.
 */
public final class ListenScenario {
    static final int WAIT_MS = 10_000;
    static final String PLAIN = "ln_plain";
    static final String MIXED = "Ln_MiXed";
    static final String NON_ASCII = "grüße ✓ 日本語 'q' \\ \"dq\"";

    static final List<String> errors = new ArrayList<>();
    static int sent;

    private ListenScenario() {}

    static void notify(Connection s, String channel, String payload) throws SQLException {
        try (PreparedStatement ps = s.prepareStatement("SELECT pg_notify(?, ?)")) {
            ps.setString(1, channel);
            ps.setString(2, payload);
            ps.execute();
        }
        sent++;
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.execute(sql);
        }
    }

    /** Waits (at most WAIT_MS for each) for want.size() notifications: exactly {@code want}. */
    static void expect(PGConnection listener, List<String> want, String step) throws SQLException {
        List<String> got = new ArrayList<>();
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (got.size() < want.size()) {
            int left = (int) (deadline - System.currentTimeMillis());
            if (left <= 0) {
                break;
            }
            PGNotification[] ns = listener.getNotifications(left);
            if (ns == null) {
                continue;
            }
            for (PGNotification n : ns) {
                got.add(n.getName() + "=" + n.getParameter());
            }
        }
        if (!got.equals(want)) {
            errors.add(step + ": got " + got + ", want " + want);
        }
    }

    static String pair(String channel, String payload) {
        return channel + "=" + payload;
    }

    public static void main(String[] args) {
        long t0 = System.currentTimeMillis();
        Properties props = new Properties();
        String url = PgjdbcScenarios.jdbcUrl(System.getenv("TARGET_URL"), props);
        try (Connection l = DriverManager.getConnection(url, props); Connection s = DriverManager.getConnection(url, props)) {
            PGConnection listener = l.unwrap(PGConnection.class);
            exec(l, "LISTEN " + PLAIN);
            exec(l, "LISTEN \"" + MIXED + "\"");
            exec(s, "NOTIFY " + PLAIN + ", 'first'");
            sent++;
            notify(s, MIXED, NON_ASCII);
            notify(s, PLAIN, "");
            s.setAutoCommit(false);
            notify(s, PLAIN, "rolled back");
            notify(s, MIXED, "rolled back");
            s.rollback();
            notify(s, MIXED, "committed 1");
            exec(s, "NOTIFY " + PLAIN + ", 'committed 2'");
            sent++;
            s.commit();
            s.setAutoCommit(true);
            notify(s, "ln_mixed", "folded name: not the listener's");
            notify(s, PLAIN, "last");
            expect(listener,
                    List.of(pair(PLAIN, "first"), pair(MIXED, NON_ASCII), pair(PLAIN, ""), pair(MIXED, "committed 1"),
                            pair(PLAIN, "committed 2"), pair(PLAIN, "last")),
                    "before UNLISTEN");
            exec(l, "UNLISTEN \"" + MIXED + "\"");
            notify(s, MIXED, "after the UNLISTEN");
            notify(s, PLAIN, "final");
            // The next one must be `final`: the UNLISTENed channel's, sent before it, is not.
            expect(listener, List.of(pair(PLAIN, "final")), "after UNLISTEN");
        } catch (SQLException e) {
            errors.add("failed: " + PgjdbcScenarios.describe(e));
        }
        String detail = "pgjdbc " + PgjdbcScenarios.driverVersion() + " getNotifications(timeout): " + sent
                + " notifications sent, " + String.format("%.1f", (System.currentTimeMillis() - t0) / 1000.0) + "s";
        if (!errors.isEmpty()) {
            detail += "; errors: " + String.join(" | ", errors);
            errors.forEach(e -> System.err.println("ERROR " + e));
        }
        System.out.println("{\"ok\": " + errors.isEmpty() + ", \"transactions\": " + sent + ", \"errors\": "
                + errors.size() + ", \"expected_errors\": 0, \"detail\": " + PgjdbcScenarios.json(detail) + "}");
        System.exit(errors.isEmpty() ? 0 : 1);
    }
}
