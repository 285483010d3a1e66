-- Five primary-key reads of one text inside a transaction block (an ORM's N+1 reads in
-- one transaction), for pgbench -f against pgbench's tables: with -M simple each read is
-- an autoprepared Query the cache serves, a first use in the block, so parsnip runs it
-- under the savepoint guard (docs/design.md, "Savepoint guard"). docs/benchmarks.md,
-- "Issue 26: reads inside blocks", has the command and what it measured.
\set aid random(1, 100000 * :scale - 4)
BEGIN;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 1;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 2;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 3;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid + 4;
END;
