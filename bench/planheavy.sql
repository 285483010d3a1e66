-- A plan-heavy, ORM-style read (bench/run.py --workload planheavy): a four-way join with a
-- lateral subquery, one account's row with its branch, its teller, the branch's other
-- tellers and a neighbourhood aggregate. PostgreSQL 15 plans it in about 0.17 ms and runs it
-- in about 0.04 ms on a warm backend (EXPLAIN (ANALYZE, SUMMARY), scale 10): planning is most
-- of the server's work, which a statement cache saves.
\set aid random(1, 100000 * :scale)
SELECT a.aid, a.abalance, b.bid, b.bbalance, t.tid, t.tbalance, t2.tid AS peer, t2.tbalance AS peer_balance,
       nb.nearby, nb.nearby_balance
FROM pgbench_accounts a
JOIN pgbench_branches b ON b.bid = a.bid
JOIN pgbench_tellers t ON t.bid = b.bid AND t.tid = (a.aid % 10) + (b.bid - 1) * 10 + 1
LEFT JOIN pgbench_tellers t2 ON t2.bid = b.bid AND t2.tid <> t.tid AND t2.tbalance >= t.tbalance
LEFT JOIN LATERAL (
    SELECT count(*) AS nearby, sum(a2.abalance) AS nearby_balance
    FROM pgbench_accounts a2
    WHERE a2.aid BETWEEN a.aid AND a.aid + 9 AND a2.bid = a.bid
) nb ON true
WHERE a.aid = :aid
ORDER BY t2.tbalance DESC NULLS LAST, t2.tid
LIMIT 5;
