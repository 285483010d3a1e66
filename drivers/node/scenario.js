#!/usr/bin/env node
'use strict'
// parsnip driver matrix: node-postgres (`pg`, `pg-cursor`) and postgres.js scenarios.
//
// Contract: drivers/README.md. Usage: node scenario.js MODE, with MODE one of
//   pg-named     node-postgres, every parameterized query a named one ({name, text, values})
//   pg-pipeline  node-postgres with `pipeline: true` (pg >= 8.23): named queries, several Syncs in flight
//   pg-cursor    node-postgres named queries, plus pg-cursor reads inside every transaction
//   pg-unnamed   node-postgres unnamed parameterized queries (P('') B D E S each time)
//   postgresjs   postgres.js with its default prepared statements (prepare: true)
//
// Each of CLIENTS connections runs ITERATIONS rounds of: statement churn (50 distinct texts),
// a read-write transaction with read-back checks, a `SELECT *` on a table that the coordinator
// alters twice (ADD COLUMN, then ALTER COLUMN ... TYPE) through DIRECT_URL midway, an error
// inside a transaction (or pipeline) followed by recovery on the same connection, and, for
// some clients, a cancel and an abrupt disconnect mid-transaction. Everything it wrote is
// verified at the end (row counts, sums, checksums), then one JSON line is printed last.

const net = require('net')
const pg = require('pg')
const Cursor = require('pg-cursor')
const postgres = require('postgres')

const MODES = ['pg-named', 'pg-pipeline', 'pg-cursor', 'pg-unnamed', 'postgresjs']
const MODE = process.argv[2]
const env = process.env
const T0 = Date.now()

const stats = {
  transactions: 0,
  errors: 0,
  expected: 0, // errors PostgreSQL itself raises here too (0A000 on a statement prepared before a DDL)
  injected: 0, // errors the scenario provokes on purpose (22012, 25P02, 42703, 57014), checked by code
  cancels: 0,
  disconnects: 0,
  retries: 0,
  churn: 0,
  wide: 0,
  cursorReads: 0,
}
const samples = []
let phase = 'start'
let printed = false

function elapsed() {
  return ((Date.now() - T0) / 1000).toFixed(1)
}

function finish(ok, extra) {
  if (printed) return
  printed = true
  ok = ok && stats.errors === 0
  const detail =
    `mode=${MODE} via_parsnip=${env.VIA_PARSNIP || '?'} clients=${CLIENTS} iterations=${ITER} ` +
    `churn_texts=${CHURN} churn=${stats.churn} wide_selects=${stats.wide} cursor_reads=${stats.cursorReads} ` +
    `injected=${stats.injected} cancels=${stats.cancels} disconnects=${stats.disconnects} ` +
    `tx_retries=${stats.retries} elapsed=${elapsed()}s` +
    (extra ? `; ${extra}` : '') +
    (samples.length ? `; errors: ${samples.join(' | ')}` : '')
  const line = {
    ok,
    transactions: stats.transactions,
    errors: stats.errors,
    expected_errors: stats.expected,
    detail,
  }
  process.stdout.write(JSON.stringify(line) + '\n', () => process.exit(ok ? 0 : 1))
}

function errText(e) {
  if (!e) return String(e)
  const code = e.code ? `[${e.code}] ` : ''
  return `${code}${(e.message || String(e)).split('\n')[0]}`
}

function bad(where, e) {
  stats.errors++
  const msg = `${where}: ${typeof e === 'string' ? e : errText(e)}`
  if (samples.length < 10) samples.push(msg)
  if (stats.errors <= 200) process.stderr.write(`[${elapsed()}s] error: ${msg}\n`)
}

if (MODE === '--version') {
  // Installed versions (their package.json files are not importable through `exports`).
  const v = (p) => JSON.parse(require('fs').readFileSync(`${__dirname}/node_modules/${p}/package.json`, 'utf8')).version
  const which = process.argv[3] || 'pg'
  process.stdout.write(which === 'postgresjs' ? `postgres ${v('postgres')}\n` : `pg ${v('pg')}, pg-cursor ${v('pg-cursor')}\n`)
  process.exit(0)
}
if (!MODES.includes(MODE)) {
  process.stderr.write(`usage: node scenario.js ${MODES.join('|')}\n`)
  process.exit(2)
}
for (const k of ['TARGET_URL', 'DIRECT_URL']) {
  if (!env[k]) {
    process.stderr.write(`${k} is not set (see drivers/README.md)\n`)
    process.exit(2)
  }
}
const TARGET_URL = env.TARGET_URL
const DIRECT_URL = env.DIRECT_URL
const TARGET = new URL(TARGET_URL)
const TARGET_HOST = env.TARGET_HOST || TARGET.hostname
const TARGET_PORT = parseInt(env.TARGET_PORT || TARGET.port || '5432', 10)
const CLIENTS = parseInt(env.CLIENTS || '100', 10)
const ITER = parseInt(env.ITERATIONS || '12', 10)
// The hang watchdog fires a little before the runner's own kill (SCENARIO_TIMEOUT_S = timeout_s).
const TIME_LIMIT_S = Math.max(10, parseFloat(env.SCENARIO_TIMEOUT_S || '60') - 5)
const CHURN = 50 // distinct churn statements, more than parsnip's max_prepared_statements = 20
const WIDE_ROWS = 20

const tag = MODE.replace(/[^a-z0-9]/g, '_')
const T = { acct: `${tag}_acct`, ledger: `${tag}_ledger`, wide: `${tag}_wide` }
const DISC_BASE = 100000 // account / ledger ids used by the disconnecting connections

// Every query bounded: a scenario that hangs reports it and exits non-zero.
const watchdog = setTimeout(() => {
  bad('watchdog', `no completion after ${TIME_LIMIT_S}s in phase '${phase}' (${unfinished} clients unfinished)`)
  finish(false, 'hang')
}, TIME_LIMIT_S * 1000)

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Hang detectors. A bound that covers a BEGIN also covers the wait for a server: through
// parsnip 100 clients share 4 server connections, and a client can queue behind several
// others' transactions (a cancelled pg_sleep, a statement_timeout) for seconds.
const QUEUED_MS = 15000

function withTimeout(p, ms, what) {
  let t
  return Promise.race([
    p,
    new Promise((_, rej) => {
      t = setTimeout(() => rej(new Error(`timeout: ${what} took more than ${ms} ms`)), ms)
    }),
  ]).finally(() => clearTimeout(t))
}

// ------------------------------------------------------------------------------ DDL coordinator

// A statement prepared while `ddl.done` was d may fail with 0A000 once if a DDL started after it
// (ddl.started > d): PostgreSQL raises "cached plan must not change result type" for it too.
const ddl = { started: 0, done: 0 }
const DDLS = [
  { at: 0.3, sql: () => `ALTER TABLE ${T.wide} ADD COLUMN c int NOT NULL DEFAULT 7` },
  { at: 0.6, sql: () => `ALTER TABLE ${T.wide} ALTER COLUMN a TYPE bigint` },
]
let progress = 0 // iterations completed, all clients
let unfinished = CLIENTS

async function coordinator(direct) {
  for (const d of DDLS) {
    while (progress < d.at * CLIENTS * ITER && unfinished > 0) await sleep(10)
    phase = `ddl ${ddl.started + 1}`
    ddl.started++
    try {
      await direct.query(d.sql())
    } catch (e) {
      bad('ddl', e)
    }
    ddl.done++
    phase = 'load'
  }
}

// ------------------------------------------------------------------------------ checks

function expectEq(where, got, want) {
  if (String(got) !== String(want)) {
    bad(where, `got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
    return false
  }
  return true
}

// `SELECT * FROM wide WHERE id <= n` (arrays): every DataRow as wide as the RowDescription, values
// where they belong, and the new column present in every result of a query issued after the ADD COLUMN.
function checkWide(where, res, n, issuedDone) {
  stats.wide++
  const nf = res.fields.length
  const want = issuedDone >= 1 ? 4 : null
  if (want !== null && nf !== want) {
    bad(where, `stale row description: ${nf} columns (${res.fields.join(',')}) after ADD COLUMN completed`)
    return false
  }
  if (nf !== 3 && nf !== 4) {
    bad(where, `unexpected columns ${res.fields.join(',')}`)
    return false
  }
  if (res.rows.length !== n) {
    bad(where, `${res.rows.length} rows, want ${n}`)
    return false
  }
  for (const row of res.rows) {
    if (row.length !== nf) {
      bad(where, `DataRow has ${row.length} columns, RowDescription ${nf}`)
      return false
    }
    const id = Number(row[0])
    if (Number(row[1]) !== id * 10 || row[2] !== `row${id}` || (nf === 4 && Number(row[3]) !== 7)) {
      bad(where, `misaligned row ${JSON.stringify(row)} for columns ${res.fields.join(',')}`)
      return false
    }
  }
  return true
}

const RETRY = 'retry'

function amountFor(c, i) {
  return ((c * 31 + i * 17) % 97) + 1
}

// ------------------------------------------------------------------------------ node-postgres worker

function sendCancelRequest(pid, secret) {
  return new Promise((resolve) => {
    const s = net.connect(TARGET_PORT, TARGET_HOST)
    s.on('error', () => resolve())
    s.on('close', () => resolve())
    s.on('connect', () => {
      const b = Buffer.alloc(16)
      b.writeInt32BE(16, 0)
      b.writeInt32BE(80877102, 4)
      b.writeInt32BE(pid, 8)
      b.writeInt32BE(secret, 12)
      s.end(b)
    })
  })
}

class PgWorker {
  constructor(c, { named, pipeline, cursor }) {
    this.c = c
    this.named = named
    this.pipeline = pipeline
    this.cursor = cursor
    this.gen = {} // statement key -> generation (a new name after a 0A000)
    this.prep = {} // statement name -> ddl.done when first issued
  }

  newClient() {
    const cl = new pg.Client({ connectionString: TARGET_URL, pipeline: this.pipeline })
    cl.on('error', () => {}) // connection-level errors surface on the queries
    cl.on('notice', () => {})
    return cl
  }

  async connect() {
    this.cl = this.newClient()
    await this.cl.connect()
  }

  async close() {
    await this.cl.end()
  }

  name(key) {
    return this.gen[key] ? `${key}_g${this.gen[key]}` : key
  }

  // Returns {fields, rows (arrays), command, doneAtIssue}.
  q(key, text, values) {
    const cfg = { text, rowMode: 'array' }
    if (values) cfg.values = values
    let doneAtIssue = ddl.done
    if (this.named && key) {
      const name = this.name(key)
      cfg.name = name
      if (!(name in this.prep)) this.prep[name] = ddl.done
      doneAtIssue = this.prep[name]
    }
    const issuedDone = ddl.done
    return this.cl.query(cfg).then((r) => ({
      fields: r.fields.map((f) => f.name),
      rows: r.rows,
      command: r.command,
      doneAtIssue,
      issuedDone,
    }))
  }

  // 0A000 is PostgreSQL's own answer for a named statement prepared before a DDL; the
  // application then moves to a new statement name (node-postgres never re-parses a name).
  isExpected0A000(key, e) {
    if (!e || e.code !== '0A000') return false
    if (!this.named || !key) return false // unnamed statements are parsed at each use
    const name = this.name(key)
    const ok = name in this.prep && ddl.started > this.prep[name]
    this.gen[key] = (this.gen[key] || 0) + 1
    return ok
  }

  sql(s) {
    return this.cl.query(s)
  }
}

// ------------------------------------------------------------------------------ statements

const S = {
  churn: (k) => `SELECT $1::int + ${k} AS v${k}, $2::text AS t`,
  upd: () => `UPDATE ${T.acct} SET balance = balance + $1 WHERE id = $2 RETURNING balance`,
  ins: () => `INSERT INTO ${T.ledger} (client, seq, amount, note) VALUES ($1, $2, $3, $4)`,
  sums: () =>
    `SELECT count(*)::int, coalesce(sum(amount), 0)::bigint, coalesce(sum(seq::bigint * amount), 0)::bigint ` +
    `FROM ${T.ledger} WHERE client = $1 AND seq > 0`,
  wide: () => `SELECT * FROM ${T.wide} WHERE id <= $1`,
  wide1: () => `SELECT * FROM ${T.wide} WHERE id = $1`,
  div0: () => `SELECT $1::int / 0 AS boom`,
  one: () => `SELECT $1::int AS one`,
  neg: () => `SELECT count(*)::int FROM ${T.ledger} WHERE client = $1 AND seq < 0`,
  bad: () => `SELECT no_such_column FROM ${T.wide} WHERE id = $1`,
  cursor: () => `SELECT seq, amount FROM ${T.ledger} WHERE client = $1 AND seq > 0 ORDER BY seq`,
  cursorWide: () => `SELECT * FROM ${T.wide} WHERE id <= $1 ORDER BY id`,
  balance: () => `SELECT balance FROM ${T.acct} WHERE id = $1`,
}

// ------------------------------------------------------------------------------ node-postgres client loop

async function pgChurn(w, st, i) {
  const jobs = []
  for (let j = 0; j < 3; j++) {
    const k = (w.c * 7 + i * 3 + j * 17) % CHURN
    const x = w.c * 1000 + i * 10 + j
    const t = `c${w.c}i${i}j${j}`
    const p = w.q(`churn${k}`, S.churn(k), [x, t]).then(
      (r) => {
        stats.churn++
        expectEq(`churn${k}`, `${r.rows[0][0]}/${r.rows[0][1]}`, `${x + k}/${t}`)
      },
      (e) => bad(`churn${k}`, e)
    )
    if (w.pipeline) jobs.push(p)
    else await p
  }
  await Promise.all(jobs)
}

// The read-write transaction. Returns true when committed and verified.
async function pgTxn(w, st, i) {
  const c = w.c
  const amt = amountFor(c, i)
  const cursorRows = 4
  if (w.pipeline) {
    const ps = [
      w.sql('BEGIN'),
      w.q('upd', S.upd(), [amt, c]),
      w.q('ins', S.ins(), [c, i, amt, `tx ${c}/${i}`]),
      w.q('sums', S.sums(), [c]),
      w.q('wide1', S.wide1(), [1 + (i % WIDE_ROWS)]),
      w.sql('COMMIT'),
    ]
    const rs = await Promise.allSettled(ps)
    const failed = rs.findIndex((r) => r.status === 'rejected')
    if (failed >= 0) {
      const e = rs[failed].reason
      const key = ['', 'upd', 'ins', 'sums', 'wide1', ''][failed]
      if (w.isExpected0A000(key, e)) {
        stats.expected++
        return RETRY
      }
      bad(`pipelined tx step ${failed}`, e)
      return false
    }
    if (rs[5].value.command !== 'COMMIT') {
      bad('pipelined tx', `COMMIT answered ${rs[5].value.command}`)
      return false
    }
    return verifyTxn(w, st, i, amt, rs[1].value, rs[3].value, rs[4].value)
  }
  await w.sql('BEGIN')
  let key = ''
  try {
    key = 'upd'
    const u = await w.q('upd', S.upd(), [amt, c])
    key = 'ins'
    await w.q('ins', S.ins(), [c, i, amt, `tx ${c}/${i}`])
    key = 'sums'
    const s = await w.q('sums', S.sums(), [c])
    key = 'wide1'
    const wd = await w.q('wide1', S.wide1(), [1 + (i % WIDE_ROWS)])
    key = 'cursor'
    if (w.cursor) {
      // pg-cursor: P('') B(C_n) D H, then E(C_n, rows) H ... with no Sync until close().
      const cur = w.cl.query(new Cursor(S.cursor(), [c], { rowMode: 'array' }))
      const got = []
      for (;;) {
        const rows = await cur.read(cursorRows)
        stats.cursorReads++
        if (rows.length === 0) break
        for (const r of rows) got.push(`${r[0]}:${r[1]}`)
      }
      await cur.close()
      // Exactly the committed rows plus the one this transaction inserted, in order.
      const want = [...st.rows, `${i}:${amt}`]
      expectEq('cursor rows', got.join(','), want.join(','))
      const n2 = 1 + ((c + i) % WIDE_ROWS)
      const issuedDone = ddl.done
      const cw = w.cl.query(new Cursor(S.cursorWide(), [n2], { rowMode: 'array' }))
      const all = []
      for (;;) {
        const rows = await cw.read(7)
        stats.cursorReads++
        if (rows.length === 0) break
        all.push(...rows)
      }
      const fields = cw._result.fields.map((f) => f.name)
      await cw.close()
      checkWide('cursor wide', { fields, rows: all }, n2, issuedDone)
    }
    key = ''
    const cm = await w.sql('COMMIT')
    if (cm.command !== 'COMMIT') {
      bad('tx', `COMMIT answered ${cm.command}`)
      return false
    }
    return verifyTxn(w, st, i, amt, u, s, wd)
  } catch (e) {
    await w.sql('ROLLBACK').catch((e2) => bad('rollback', e2))
    if (w.isExpected0A000(key, e)) {
      stats.expected++
      return RETRY
    }
    bad(`tx ${key}`, e)
    return false
  }
}

function verifyTxn(w, st, i, amt, u, s, wd) {
  st.rows.push(`${i}:${amt}`)
  st.count++
  st.sum += amt
  st.check += i * amt
  st.balance += amt
  stats.transactions++
  let ok = expectEq('tx balance', u.rows[0][0], st.balance)
  ok = expectEq('tx sums', s.rows[0].join('/'), `${st.count}/${st.sum}/${st.check}`) && ok
  ok = checkWide('tx wide1', wd, 1, wd.issuedDone) && ok
  return ok
}

async function pgWide(w, i) {
  const n = 1 + ((w.c * 3 + i) % WIDE_ROWS)
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const r = await w.q('wide', S.wide(), [n])
      checkWide('wide', r, n, r.issuedDone)
      return true
    } catch (e) {
      if (attempt === 0 && w.isExpected0A000('wide', e)) {
        stats.expected++
        continue
      }
      bad('wide', e)
      return false
    }
  }
  return false
}

// A failing statement in the middle of a transaction (and a pipeline), then recovery.
async function pgErrorInTx(w, i) {
  const c = w.c
  if (w.pipeline) {
    const ps = [
      w.sql('BEGIN'),
      w.q('ins', S.ins(), [c, -i, 5, 'rolled back']),
      w.q('div0', S.div0(), [i]),
      w.q('one', S.one(), [1]),
      w.sql('COMMIT'),
      w.q('neg', S.neg(), [c]),
    ]
    const rs = await Promise.allSettled(ps)
    const codes = rs.map((r) => (r.status === 'fulfilled' ? 'ok' : r.reason.code || errText(r.reason)))
    const want = ['ok', 'ok', '22012', '25P02', 'ok', 'ok']
    if (codes.join(',') !== want.join(',')) {
      bad('pipeline error', `results ${codes.join(',')}, want ${want.join(',')}`)
      return
    }
    stats.injected += 2
    expectEq('pipeline error: COMMIT of failed tx', rs[4].value.command, 'ROLLBACK')
    expectEq('pipeline error: rolled-back rows', rs[5].value.rows[0][0], 0)
    return
  }
  await w.sql('BEGIN')
  try {
    await w.q('ins', S.ins(), [c, -i, 5, 'rolled back'])
    try {
      await w.q('div0', S.div0(), [i])
      bad('error in tx', 'division by zero succeeded')
    } catch (e) {
      if (e.code === '22012') stats.injected++
      else bad('error in tx', e)
    }
    try {
      await w.q('one', S.one(), [1])
      bad('error in tx', 'statement after an error succeeded')
    } catch (e) {
      if (e.code === '25P02') stats.injected++
      else bad('error in tx (25P02)', e)
    }
  } finally {
    await w.sql('ROLLBACK')
  }
  const r = await w.q('neg', S.neg(), [c])
  expectEq('error in tx: rolled-back rows', r.rows[0][0], 0)
}

// A named statement whose Parse fails (42703), twice, between good ones: the failed Parse must
// leave nothing behind. In pipeline mode the three go out back to back with their own Syncs.
async function pgParseError(w, i) {
  const x = w.c * 100 + i
  if (w.pipeline) {
    const ps = [w.q('one', S.one(), [x]), w.q('bad', S.bad(), [1]), w.q('one', S.one(), [x + 1])]
    const rs = await Promise.allSettled(ps)
    const codes = rs.map((r) => (r.status === 'fulfilled' ? 'ok' : r.reason.code || errText(r.reason)))
    if (codes.join(',') !== 'ok,42703,ok') {
      bad('pipeline parse error', `results ${codes.join(',')}, want ok,42703,ok`)
      return
    }
    stats.injected++
    expectEq('pipeline parse error', `${rs[0].value.rows[0][0]}/${rs[2].value.rows[0][0]}`, `${x}/${x + 1}`)
    return
  }
  for (let k = 0; k < 2; k++) {
    try {
      await w.q('bad', S.bad(), [1])
      bad('parse error', 'a query on a missing column succeeded')
    } catch (e) {
      if (e.code === '42703') stats.injected++
      else bad('parse error', e)
    }
    const r = await w.q('one', S.one(), [x + k])
    expectEq('after parse error', r.rows[0][0], x + k)
  }
}

// statement_timeout: 57014 inside a transaction, ROLLBACK, and the connection works.
async function pgTimeoutCancel(w) {
  await w.sql('BEGIN')
  await w.sql(`SET LOCAL statement_timeout = '100ms'`)
  try {
    await withTimeout(w.q('sleep', 'SELECT pg_sleep($1::float8)', [3]), 6000, 'pg_sleep under statement_timeout')
    bad('statement_timeout', 'pg_sleep(3) was not cancelled')
  } catch (e) {
    if (e.code === '57014') {
      stats.injected++
      stats.cancels++
    } else bad('statement_timeout', e)
  }
  await w.sql('ROLLBACK')
  const r = await w.q('one', S.one(), [42])
  expectEq('after statement_timeout', r.rows[0][0], 42)
}

// A CancelRequest with the key the driver got in BackendKeyData (node-postgres has no public
// cancel API), sent to TARGET while pg_sleep runs inside a transaction.
async function pgCancelRequest(w) {
  await w.sql('BEGIN')
  const t0 = Date.now()
  let settled = false
  const p = w.q('sleep', 'SELECT pg_sleep($1::float8)', [5]).then(
    () => ({ ok: true }),
    (e) => ({ e })
  )
  p.then(() => (settled = true))
  while (!settled && Date.now() - t0 < 4000) {
    await sleep(150)
    if (!settled) await sendCancelRequest(w.cl.processID, w.cl.secretKey)
  }
  const r = await withTimeout(p, 3000, 'cancelled pg_sleep')
  if (r.ok) bad('cancel request', 'pg_sleep(5) completed despite CancelRequest')
  else if (r.e.code === '57014') {
    stats.injected++
    stats.cancels++
  } else bad('cancel request', r.e)
  await w.sql('ROLLBACK')
  const q = await w.q('one', S.one(), [7])
  expectEq('after cancel', q.rows[0][0], 7)
}

// A second connection updates a row and inserts, then its socket is destroyed mid-transaction;
// the main connection must then be able to lock the same row (lock_timeout 5 s) and must not
// see the dead transaction's writes.
async function pgDisconnect(w) {
  const id = DISC_BASE + w.c
  const cl = w.newClient()
  await cl.connect()
  await cl.query('BEGIN')
  await cl.query({ name: 'dupd', text: S.upd(), values: [1000000, id] })
  await cl.query({ name: 'dins', text: S.ins(), values: [id, 1, 1, 'never committed'] })
  cl.connection.stream.destroy()
  stats.disconnects++
  await w.sql('BEGIN')
  try {
    await w.sql(`SET LOCAL lock_timeout = '5s'`)
    const r = await w.q('upd', S.upd(), [1, id])
    expectEq('after disconnect: balance', r.rows[0][0], 1)
    const n = await w.q('sums', S.sums(), [id])
    expectEq('after disconnect: rows', n.rows[0][0], 0)
    await w.sql('COMMIT')
  } catch (e) {
    await w.sql('ROLLBACK').catch(() => {})
    bad('after disconnect', e)
  }
}

async function pgReadBack(w, st) {
  const s = await w.q('sums', S.sums(), [w.c])
  expectEq(`readback client ${w.c}`, s.rows[0].join('/'), `${st.count}/${st.sum}/${st.check}`)
  const b = await w.q('balance', S.balance(), [w.c])
  expectEq(`readback balance ${w.c}`, b.rows[0][0], st.balance)
}

const SPECIAL = {
  1: ['statement_timeout', pgTimeoutCancel],
  2: ['cancel request', pgCancelRequest],
  3: ['disconnect', pgDisconnect],
}

async function pgClient(c, opts, totals) {
  const w = new PgWorker(c, opts)
  const st = { count: 0, sum: 0, check: 0, balance: 0, rows: [] }
  await w.connect()
  for (let i = 1; i <= ITER; i++) {
    await pgChurn(w, st, i)
    // An expected 0A000 rolled the transaction back: run it again (a new statement name).
    let r = RETRY
    for (let attempt = 0; attempt < 3 && r === RETRY; attempt++) {
      if (attempt > 0) stats.retries++
      r = await pgTxn(w, st, i)
    }
    if (r === RETRY) bad('tx', `client ${c} iteration ${i}: 0A000 three times in a row`)
    await pgWide(w, i)
    if (i % 4 === 2) await pgErrorInTx(w, i)
    if (i === 3 && w.named) await pgParseError(w, i)
    const sp = SPECIAL[c % 10]
    if (sp && i === 2 + (c % 3)) {
      try {
        await sp[1](w)
      } catch (e) {
        bad(sp[0], e)
      }
    }
    progress++
  }
  // After both DDLs: this connection works again, without reconnecting.
  while (ddl.done < DDLS.length) await sleep(10)
  await pgWide(w, 0)
  await pgReadBack(w, st)
  totals.count += st.count
  totals.sum += st.sum
  totals.check += st.check
  await w.close()
}

// ------------------------------------------------------------------------------ postgres.js

class JsWorker {
  constructor(c) {
    this.c = c
    this.prep = {} // statement text -> ddl.done when this connection (re)prepared it
  }

  make(extra) {
    return postgres(TARGET_URL, {
      max: 1,
      prepare: true,
      idle_timeout: 0,
      connect_timeout: 10,
      onnotice: () => {},
      ...extra,
    })
  }

  async connect() {
    this.sql = this.make()
    await this.sql`SELECT 1`
  }

  async close() {
    await this.sql.end({ timeout: 5 })
  }

  // Returns {fields, rows (arrays), command, doneAtIssue}.
  async q(text, values, h = this.sql) {
    if (!(text in this.prep)) this.prep[text] = ddl.done
    const doneAtIssue = this.prep[text]
    const issuedDone = ddl.done
    // unsafe() with prepare: true is what a tagged template does (postgres.js's default,
    // prepare: true); plain unsafe() would use the unnamed statement.
    const r = await h.unsafe(text, values || [], { prepare: true }).values()
    return {
      fields: (r.columns || []).map((c) => c.name),
      rows: Array.from(r),
      command: r.command,
      doneAtIssue,
      issuedDone,
    }
  }

  // Outside a transaction postgres.js re-prepares transparently on 0A000 (RevalidateCachedQuery);
  // inside one the retry hits the aborted transaction and the 0A000 reaches the application.
  isExpected0A000(text, e) {
    if (!e || e.code !== '0A000' || !text) return false
    const ok = text in this.prep && ddl.started > this.prep[text]
    this.prep[text] = ddl.done
    return ok
  }
}

async function jsChurn(w, i) {
  // Issued together: postgres.js pipelines them on its one connection.
  const jobs = []
  for (let j = 0; j < 3; j++) {
    const k = (w.c * 7 + i * 3 + j * 17) % CHURN
    const x = w.c * 1000 + i * 10 + j
    const t = `c${w.c}i${i}j${j}`
    jobs.push(
      w.q(S.churn(k), [x, t]).then(
        (r) => {
          stats.churn++
          expectEq(`churn${k}`, `${r.rows[0][0]}/${r.rows[0][1]}`, `${x + k}/${t}`)
        },
        (e) => bad(`churn${k}`, e)
      )
    )
  }
  await Promise.all(jobs)
}

async function jsTxn(w, st, i) {
  const c = w.c
  const amt = amountFor(c, i)
  let text = ''
  let got
  try {
    got = await w.sql.begin(async (tx) => {
      text = S.upd()
      const u = await w.q(text, [amt, c], tx)
      text = S.ins()
      await w.q(text, [c, i, amt, `tx ${c}/${i}`], tx)
      // A failing statement inside a savepoint, then the transaction goes on.
      if (i % 4 === 0) {
        text = ''
        try {
          await tx.savepoint((sp) => w.q(S.div0(), [i], sp))
          bad('savepoint', 'division by zero succeeded')
        } catch (e) {
          if (e.code === '22012') stats.injected++
          else throw e
        }
      }
      text = S.sums()
      const s = await w.q(text, [c], tx)
      text = S.wide1()
      const wd = await w.q(text, [1 + (i % WIDE_ROWS)], tx)
      text = ''
      return [u, s, wd]
    })
  } catch (e) {
    if (w.isExpected0A000(text, e)) {
      stats.expected++
      return RETRY
    }
    bad(`tx ${text.slice(0, 30)}`, e)
    return false
  }
  return verifyTxn(w, st, i, amt, got[0], got[1], got[2])
}

async function jsWide(w, i) {
  const n = 1 + ((w.c * 3 + i) % WIDE_ROWS)
  try {
    const r = await w.q(S.wide(), [n])
    return checkWide('wide', r, n, r.issuedDone)
  } catch (e) {
    // Outside a transaction postgres.js retries 0A000 itself; PostgreSQL raises nothing else here.
    bad('wide', e)
    return false
  }
}

async function jsErrorInTx(w, i) {
  const c = w.c
  try {
    await w.sql.begin(async (tx) => {
      await w.q(S.ins(), [c, -i, 5, 'rolled back'], tx)
      await w.q(S.div0(), [i], tx)
    })
    bad('error in tx', 'division by zero succeeded')
  } catch (e) {
    if (e.code === '22012') stats.injected++
    else bad('error in tx', e)
  }
  // Pipelined on the same connection: a good query, a failing one, a good one.
  const rs = await Promise.allSettled([w.q(S.one(), [i]), w.q(S.div0(), [i]), w.q(S.one(), [i + 1])])
  const codes = rs.map((r) => (r.status === 'fulfilled' ? 'ok' : r.reason.code || errText(r.reason)))
  if (codes.join(',') !== 'ok,22012,ok') bad('pipelined error', `results ${codes.join(',')}, want ok,22012,ok`)
  else stats.injected++
  const r = await w.q(S.neg(), [c])
  expectEq('error in tx: rolled-back rows', r.rows[0][0], 0)
}

async function jsTimeoutCancel(w) {
  try {
    await withTimeout(
      w.sql.begin(async (tx) => {
        await tx.unsafe(`SET LOCAL statement_timeout = '100ms'`)
        await w.q('SELECT pg_sleep($1::float8)', [3], tx)
      }),
      QUEUED_MS,
      'pg_sleep under statement_timeout'
    )
    bad('statement_timeout', 'pg_sleep(3) was not cancelled')
  } catch (e) {
    if (e.code === '57014') {
      stats.injected++
      stats.cancels++
    } else bad('statement_timeout', e)
  }
  const r = await w.q(S.one(), [42])
  expectEq('after statement_timeout', r.rows[0][0], 42)
}

// True once PostgreSQL sleeps in the statement carrying `marker` (seen through a connection of
// its own to PostgreSQL). A one-shot cancel needs that to be sure of a query to hit: PostgreSQL
// drops a cancel that reaches a backend between two messages, and through a pooler a query
// sent 150 ms ago may still be waiting for a server, or be between its Describe (answered)
// and its Execute (not sent yet), as it may on a busy server without one.
async function waitSleeping(marker, ms = 10000) {
  const side = new pg.Client({ connectionString: DIRECT_URL, application_name: 'side-cancel' })
  side.on('error', () => {})
  await side.connect()
  try {
    for (const limit = Date.now() + ms; Date.now() < limit; ) {
      const r = await side.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event = 'PgSleep' ` +
          `AND position($1 in query) > 0 AND pid <> pg_backend_pid()`,
        [marker]
      )
      if (r.rows[0].n > 0) return true
      await sleep(20)
    }
    return false
  } finally {
    await side.end().catch(() => {})
  }
}

// postgres.js's cancel API: query.cancel() sends a CancelRequest with the connection's key.
async function jsCancel(w) {
  const marker = `cancel-me c${w.c}.`
  try {
    await withTimeout(
      w.sql.begin(async (tx) => {
        const q = tx.unsafe(`SELECT pg_sleep($1::float8) /* ${marker} */`, [5], { prepare: true })
        q.catch(() => {})
        // cancel() is one-shot: it is sent once PostgreSQL runs the query.
        if (!(await waitSleeping(marker))) bad('cancel', 'pg_sleep(5) was never seen running')
        q.cancel()
        await q
      }),
      QUEUED_MS,
      'cancelled pg_sleep'
    )
    bad('cancel', 'pg_sleep(5) completed despite cancel()')
  } catch (e) {
    if (e.code === '57014') {
      stats.injected++
      stats.cancels++
    } else bad('cancel', e)
  }
  const r = await w.q(S.one(), [7])
  expectEq('after cancel', r.rows[0][0], 7)
}

async function jsDisconnect(w) {
  const id = DISC_BASE + w.c
  let sock = null
  const sql2 = w.make({
    socket: () => {
      sock = net.connect(TARGET_PORT, TARGET_HOST)
      return sock
    },
  })
  // The socket dies mid-transaction and the application never touches this instance again
  // (postgres.js 3.4 crashes writing to a socket it saw close, so there is no ROLLBACK either).
  await withTimeout(
    new Promise((resolve, reject) => {
      sql2
        .begin(async (tx) => {
          await tx.unsafe(S.upd(), [1000000, id], { prepare: true })
          await tx.unsafe(S.ins(), [id, 1, 1, 'never committed'], { prepare: true })
          sock.destroy()
          stats.disconnects++
          resolve()
          await new Promise(() => {})
        })
        .catch(reject)
    }),
    QUEUED_MS,
    'transaction before the disconnect'
  )
  try {
    const [u, n] = await w.sql.begin(async (tx) => {
      await tx.unsafe(`SET LOCAL lock_timeout = '5s'`)
      const u = await w.q(S.upd(), [1, id], tx)
      const n = await w.q(S.sums(), [id], tx)
      return [u, n]
    })
    expectEq('after disconnect: balance', u.rows[0][0], 1)
    expectEq('after disconnect: rows', n.rows[0][0], 0)
  } catch (e) {
    bad('after disconnect', e)
  }
}

const JS_SPECIAL = {
  1: ['statement_timeout', jsTimeoutCancel],
  2: ['cancel', jsCancel],
  3: ['disconnect', jsDisconnect],
}

async function jsClient(c, totals) {
  const w = new JsWorker(c)
  const st = { count: 0, sum: 0, check: 0, balance: 0, rows: [] }
  await w.connect()
  for (let i = 1; i <= ITER; i++) {
    await jsChurn(w, i)
    let r = RETRY
    for (let attempt = 0; attempt < 3 && r === RETRY; attempt++) {
      if (attempt > 0) stats.retries++
      r = await jsTxn(w, st, i)
    }
    if (r === RETRY) bad('tx', `client ${c} iteration ${i}: 0A000 three times in a row`)
    await jsWide(w, i)
    if (i % 4 === 2) await jsErrorInTx(w, i)
    const sp = JS_SPECIAL[c % 10]
    if (sp && i === 2 + (c % 3)) {
      try {
        await sp[1](w)
      } catch (e) {
        bad(sp[0], e)
      }
    }
    progress++
  }
  while (ddl.done < DDLS.length) await sleep(10)
  await jsWide(w, 0)
  const s = await w.q(S.sums(), [c])
  expectEq(`readback client ${c}`, s.rows[0].join('/'), `${st.count}/${st.sum}/${st.check}`)
  const b = await w.q(S.balance(), [c])
  expectEq(`readback balance ${c}`, b.rows[0][0], st.balance)
  totals.count += st.count
  totals.sum += st.sum
  totals.check += st.check
  await w.close()
}

// ------------------------------------------------------------------------------ main

async function setup(direct) {
  await direct.query(`DROP TABLE IF EXISTS ${T.acct}, ${T.ledger}, ${T.wide}`)
  await direct.query(`CREATE TABLE ${T.acct} (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`)
  await direct.query(
    `INSERT INTO ${T.acct} SELECT g, 0 FROM generate_series(1, ${CLIENTS}) g ` +
      `UNION ALL SELECT ${DISC_BASE} + g, 0 FROM generate_series(1, ${CLIENTS}) g`
  )
  await direct.query(
    `CREATE TABLE ${T.ledger} (client int NOT NULL, seq int NOT NULL, amount int NOT NULL, note text)`
  )
  await direct.query(`CREATE INDEX ON ${T.ledger} (client)`)
  await direct.query(`CREATE TABLE ${T.wide} (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL)`)
  await direct.query(
    `INSERT INTO ${T.wide} SELECT g, g * 10, 'row' || g FROM generate_series(1, ${WIDE_ROWS}) g`
  )
}

async function finalChecks(direct, totals) {
  const one = async (sql) => (await direct.query({ text: sql, rowMode: 'array' })).rows[0]
  const g = await one(
    `SELECT count(*)::int, coalesce(sum(amount), 0)::bigint, coalesce(sum(seq::bigint * amount), 0)::bigint ` +
      `FROM ${T.ledger} WHERE client <= ${CLIENTS} AND seq > 0`
  )
  expectEq('global ledger', g.join('/'), `${totals.count}/${totals.sum}/${totals.check}`)
  expectEq('global ledger rows', totals.count, CLIENTS * ITER)
  const b = await one(`SELECT coalesce(sum(balance), 0)::bigint FROM ${T.acct} WHERE id <= ${CLIENTS}`)
  expectEq('global balance', b[0], totals.sum)
  const dirty = await one(`SELECT count(*)::int FROM ${T.ledger} WHERE seq < 0 OR client > ${DISC_BASE}`)
  expectEq('rows of rolled-back or dead transactions', dirty[0], 0)
  const dead = await one(`SELECT count(*)::int FROM ${T.acct} WHERE id > ${DISC_BASE} AND balance >= 1000000`)
  expectEq('updates of dead transactions', dead[0], 0)
  const cols = await one(
    `SELECT string_agg(attname || ':' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) ` +
      `FROM pg_attribute WHERE attrelid = '${T.wide}'::regclass AND attnum > 0 AND NOT attisdropped`
  )
  expectEq('schema after DDL', cols[0], 'id:integer,a:bigint,b:text,c:integer')
  // No server connection of this database left inside a transaction (waits for the disconnects).
  let n = -1
  for (let k = 0; k < 50; k++) {
    n = (
      await one(
        `SELECT count(*)::int FROM pg_stat_activity WHERE datname = current_database() ` +
          `AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`
      )
    )[0]
    if (n === 0) break
    await sleep(100)
  }
  expectEq('server connections idle in transaction', n, 0)
}

async function main() {
  const direct = new pg.Client({ connectionString: DIRECT_URL })
  direct.on('error', () => {})
  await direct.connect()
  await direct.query(`SET lock_timeout = '15s'`)
  phase = 'setup'
  await setup(direct)
  phase = 'load'
  const totals = { count: 0, sum: 0, check: 0 }
  const opts = {
    'pg-named': { named: true, pipeline: false, cursor: false },
    'pg-pipeline': { named: true, pipeline: true, cursor: false },
    'pg-cursor': { named: true, pipeline: false, cursor: true },
    'pg-unnamed': { named: false, pipeline: false, cursor: false },
  }[MODE]
  const coord = coordinator(direct)
  const clients = []
  for (let c = 1; c <= CLIENTS; c++) {
    const run = opts ? pgClient(c, opts, totals) : jsClient(c, totals)
    clients.push(
      run
        .catch((e) => bad(`client ${c}`, e))
        .finally(() => {
          unfinished--
        })
    )
  }
  await Promise.all(clients)
  await coord
  phase = 'final checks'
  await finalChecks(direct, totals)
  await direct.end()
  clearTimeout(watchdog)
  finish(true)
}

process.on('unhandledRejection', (e) => bad('unhandled rejection', e))
main().catch((e) => {
  bad(`phase ${phase}`, e)
  finish(false)
})
