#!/usr/bin/env node
'use strict'
// parsnip driver matrix: node-postgres's own listener API (issue 27), `client.on('notification')`.
//
// Contract: drivers/README.md. A listener client LISTENs on `ln_plain` and on the quoted
// mixed-case `"Ln_MiXed"`; a second client sends NOTIFYs: plain, non-ASCII and empty
// payloads, pg_notify() with parameters, a transaction that rolls back and one that commits,
// and one on `ln_mixed` (the folded name: not the listener's). The listener must get exactly
// the committed ones of its channels, in order, channel names and payloads byte for byte.
// Then it UNLISTENs `"Ln_MiXed"` and must not get that channel's next one. Every wait is
// bounded (WAIT_MS per notification); one JSON line is printed last.

const pg = require('pg')

const TARGET_URL = process.env.TARGET_URL
const WAIT_MS = 10000
const PLAIN = 'ln_plain'
const MIXED = 'Ln_MiXed'
const NON_ASCII = `grüße ✓ 日本語 'q' \\ "dq"`

const errors = []
let sent = 0
const t0 = Date.now()

function finish() {
  const detail =
    `pg ${require('pg/package.json').version} on('notification'): ${sent} notifications sent, ` +
    `${((Date.now() - t0) / 1000).toFixed(1)}s` +
    (errors.length ? `; errors: ${errors.join(' | ')}` : '')
  for (const e of errors) process.stderr.write(`ERROR ${e}\n`)
  process.stdout.write(
    JSON.stringify({ ok: errors.length === 0, transactions: sent, errors: errors.length, expected_errors: 0, detail }) +
      '\n'
  )
  process.exit(errors.length === 0 ? 0 : 1)
}

// Notifications as they arrive, and a bounded wait for the next ones.
const got = []
let wake = null
function onNotification(msg) {
  got.push([msg.channel, msg.payload])
  if (wake) wake()
}

function take(n) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      wake = null
      resolve(got.splice(0, got.length))
    }, WAIT_MS)
    const check = () => {
      if (got.length >= n) {
        clearTimeout(timer)
        wake = null
        resolve(got.splice(0, n))
      }
    }
    wake = check
    check()
  })
}

async function expectNotifications(want, step) {
  const have = await take(want.length)
  if (JSON.stringify(have) !== JSON.stringify(want)) {
    errors.push(`${step}: got ${JSON.stringify(have)}, want ${JSON.stringify(want)}`)
  }
}

async function main() {
  const listener = new pg.Client({ connectionString: TARGET_URL })
  const s = new pg.Client({ connectionString: TARGET_URL })
  listener.on('error', (e) => errors.push(`listener: ${e.message}`))
  s.on('error', (e) => errors.push(`sender: ${e.message}`))
  await listener.connect()
  await s.connect()
  listener.on('notification', onNotification)
  await listener.query(`LISTEN ${PLAIN}`)
  await listener.query(`LISTEN "${MIXED}"`)
  const notify = async (ch, payload) => {
    await s.query('SELECT pg_notify($1, $2)', [ch, payload])
    sent++
  }
  await s.query(`NOTIFY ${PLAIN}, 'first'`)
  sent++
  await notify(MIXED, NON_ASCII)
  await notify(PLAIN, '')
  await s.query('BEGIN')
  await notify(PLAIN, 'rolled back')
  await notify(MIXED, 'rolled back')
  await s.query('ROLLBACK')
  await s.query('BEGIN')
  await notify(MIXED, 'committed 1')
  await s.query(`NOTIFY ${PLAIN}, 'committed 2'`)
  sent++
  await s.query('COMMIT')
  await notify('ln_mixed', "folded name: not the listener's")
  await notify(PLAIN, 'last')
  await expectNotifications(
    [
      [PLAIN, 'first'],
      [MIXED, NON_ASCII],
      [PLAIN, ''],
      [MIXED, 'committed 1'],
      [PLAIN, 'committed 2'],
      [PLAIN, 'last'],
    ],
    'before UNLISTEN'
  )
  await listener.query(`UNLISTEN "${MIXED}"`)
  await notify(MIXED, 'after the UNLISTEN')
  await notify(PLAIN, 'final')
  // The next one must be `final`: the UNLISTENed channel's, sent before it, is not.
  await expectNotifications([[PLAIN, 'final']], 'after UNLISTEN')
  await listener.end()
  await s.end()
  finish()
}

main().catch((e) => {
  errors.push(`failed: ${e.message}`)
  finish()
})
