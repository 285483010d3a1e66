//! Plays one hostile stream against parsnip, within a hard time bound, and checks what comes
//! back: well-formed backend messages only, nothing after a FATAL, and never an honest
//! client's data (its run marker).

use super::stream::{Plan, Step};
use super::*;

/// A hostile connection lives at most this long (so that it cannot hold a server longer).
pub const HOSTILE_LIFETIME: Duration = Duration::from_millis(1500);

/// At most this much of what a hostile client received is kept for the report.
const KEEP_RECEIVED: usize = 16 << 10;

/// At most this much of what a hostile client sent is kept for the report.
const KEEP_SENT: usize = 64 << 10;

/// Checks of the bytes a hostile client received.
struct Checker {
    marker: Vec<u8>,
    fatal_seen: bool,
    /// A protocol 2.0 startup: PostgreSQL answers in 2.0's unframed format.
    v2: bool,
    violations: Vec<String>,
    frames: usize,
}

impl Checker {
    fn frame(&mut self, f: &Frame) {
        self.frames += 1;
        if !b"RKSZTDCEN123ntsIGHWdcAVv".contains(&f.tag) {
            self.violations.push(format!("unknown backend message type {:?}", f.tag as char));
        }
        if self.fatal_seen {
            self.violations.push(format!("message {} after a FATAL", normalize(f)));
        }
        if f.tag == b'E' && f.fields().is_some_and(|e| matches!(e.severity(), "FATAL" | "PANIC")) {
            self.fatal_seen = true;
        }
        if !self.marker.is_empty() && f.body.windows(self.marker.len()).any(|w| w == self.marker) {
            self.violations.push(format!("an honest client's data: {}", normalize(f)));
        }
    }
}

/// Runs `plan` on a new connection to `port`; the record says what was sent and received,
/// and the violations found (empty when parsnip behaved).
pub async fn run(port: u16, phase: u64, idx: u64, plan: &Plan, marker: &str) -> (HostileRecord, Vec<String>) {
    let start = Instant::now();
    let mut rec = HostileRecord {
        phase,
        idx,
        seed: plan.seed,
        start,
        end: start,
        desc: plan.describe(),
        sent: Vec::new(),
        sent_total: 0,
        received: Vec::new(),
        outcome: String::new(),
    };
    let v2 = plan.steps.first().is_some_and(|s| s.bytes().get(4..8) == Some(&[0, 2, 0, 0]));
    let mut chk =
        Checker { marker: marker.as_bytes().to_vec(), fatal_seen: false, v2, violations: Vec::new(), frames: 0 };
    let deadline = start + HOSTILE_LIFETIME;
    rec.outcome = match Wire::connect(port).await {
        Err(e) => format!("connect failed: {e}"),
        Ok(mut wire) => play(&mut wire, plan, deadline, &mut rec, &mut chk).await,
    };
    rec.end = Instant::now();
    (rec, chk.violations)
}

fn keep(rec: &mut HostileRecord, bytes: &[u8]) {
    let room = KEEP_RECEIVED.saturating_sub(rec.received.len());
    rec.received.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// Reads frames until `readies` ReadyForQuery (0: none expected), the bound, or the end.
async fn read(
    wire: &mut Wire,
    until: Instant,
    readies: usize,
    rec: &mut HostileRecord,
    chk: &mut Checker,
) -> Result<(), String> {
    let mut seen = 0;
    loop {
        match wire.read_frame(until).await {
            Ok(f) => {
                keep(rec, &frame_bytes(&f));
                chk.frame(&f);
                if f.tag == b'Z' {
                    seen += 1;
                    if readies > 0 && seen >= readies {
                        return Ok(());
                    }
                }
            }
            Err(ReadEnd::Timeout) => return Ok(()),
            Err(ReadEnd::Closed) => return Err("closed by parsnip".into()),
            Err(ReadEnd::Malformed(m)) => {
                if !chk.v2 {
                    chk.violations.push(format!("malformed reply: {m}"));
                }
                return Err("malformed reply".into());
            }
        }
    }
}

async fn play(wire: &mut Wire, plan: &Plan, deadline: Instant, rec: &mut HostileRecord, chk: &mut Checker) -> String {
    for step in &plan.steps {
        if Instant::now() >= deadline {
            return "lifetime over, vanished".into();
        }
        match step {
            Step::Write(_) => {
                let bytes = step.bytes();
                let r = tokio::time::timeout_at(deadline.into(), wire.send(&bytes)).await;
                match r {
                    Ok(Ok(())) => {
                        let room = KEEP_SENT.saturating_sub(rec.sent.len());
                        rec.sent.extend_from_slice(&bytes[..bytes.len().min(room)]);
                        rec.sent_total += bytes.len();
                    }
                    Ok(Err(e)) => return format!("write failed: {e}"),
                    Err(_) => return "write blocked until the lifetime ended, vanished".into(),
                }
            }
            Step::Read { ms, readies } => {
                let until = deadline.min(Instant::now() + Duration::from_millis(*ms));
                if let Err(e) = read(wire, until, *readies, rec, chk).await {
                    return e;
                }
            }
            Step::ReadByte => match wire.read_some(deadline, 1).await {
                Ok(b) => {
                    keep(rec, &b);
                    match b.as_slice() {
                        b"N" => {}
                        // PostgreSQL itself (direct mode) may offer GSS or TLS: the stream ends.
                        b"S" | b"G" => return format!("SSL/GSSENC request answered {:?}", b[0] as char),
                        _ => {
                            chk.violations.push(format!("SSL/GSSENC request answered {}", hex(&b)));
                            return "odd answer to SSLRequest".into();
                        }
                    }
                }
                Err(e) => return format!("no answer to SSLRequest: {e:?}"),
            },
            Step::Login => loop {
                match wire.read_frame(deadline).await {
                    Ok(f) => {
                        keep(rec, &frame_bytes(&f));
                        chk.frame(&f);
                        match f.tag {
                            b'Z' => break,
                            b'E' => return format!("login refused: {}", normalize(&f)),
                            _ => {}
                        }
                    }
                    Err(e) => return format!("login did not finish: {e:?}"),
                }
            },
            Step::HalfClose { ms } => {
                use tokio::io::AsyncWriteExt;
                let _ = wire.stream.shutdown().await;
                let until = deadline.min(Instant::now() + Duration::from_millis(*ms));
                let _ = read(wire, until, 0, rec, chk).await;
                return "half-closed".into();
            }
            Step::Close => return "closed".into(),
        }
    }
    "plan done".into()
}
