//! Opening a server connection to one of a database's hosts (libpq's multi-host
//! connections): hosts tried in the order `pool::hosts::HostMemory::plan` gives, each
//! within the connect timeout; with a `target_session_attrs` other than `any`, the role of
//! each server that logs in is read from the ParameterStatus it sent at login
//! (`in_hot_standby` and `default_transaction_read_only`, PostgreSQL 14 on) or, failing
//! that, asked with one query; a server of the wrong role is closed and the next host
//! tried. prefer-standby keeps the first non-standby it met in case no standby is up.
//! What was learnt (down, role) goes to the shared `HostMemory`. A pool that takes a
//! primary (`read-write`, `primary`) from a host list not surveyed yet asks every host at
//! once first (`survey`), so that an old primary listed before the promoted server is
//! refused (`pool::fence`) even by a parsnip that never saw the promotion.

use super::server_conn::{self, ConnectError, ServerConn, ServerTarget};
use crate::auth::Credentials;
use crate::config::TargetSessionAttrs;
use crate::pool::fence::{Answer, FENCE_QUERY, Seen};
use crate::pool::hosts::{HostMemory, ROLE_QUERY, Role};
use std::time::Duration;

/// Connects to a host of `target` that suits its target_session_attrs.
pub(crate) async fn connect(
    target: &ServerTarget,
    creds: &Credentials,
    timeout: Duration,
    memory: &HostMemory,
) -> Result<ServerConn, ConnectError> {
    let attrs = target.attrs;
    if target.hosts.len() < 2 && attrs == TargetSessionAttrs::Any {
        return server_conn::connect(&target.at(0), creds, timeout).await;
    }
    if takes_primary(attrs) && target.hosts.len() > 1 && !memory.fences.known(&target.hosts) {
        return survey(target, creds, timeout, memory).await;
    }
    let mut choice = Choice::new(target);
    for i in memory.plan(&target.hosts, attrs, target.balance) {
        let one = target.at(i);
        let place = place(&one);
        let probe = probe(&one, creds, timeout, attrs, &place).await;
        let verdict = match &probe {
            Probe::Up { fence: Some((system_id, timeline)), .. } => {
                let judged = memory.fences.check(&one.host, one.port, system_id, *timeline);
                refusal(&place, *timeline, judged)
            }
            _ => Ok(()),
        };
        if let Some(c) = choice.take(&one, &place, probe, verdict, memory) {
            return Ok(*c);
        }
    }
    choice.finish()
}

/// Whether servers are taken as primaries for `attrs` (and so fenced).
fn takes_primary(attrs: TargetSessionAttrs) -> bool {
    matches!(attrs, TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary)
}

/// A host as errors and logs name it.
fn place(one: &ServerTarget) -> String {
    if one.host.starts_with('/') {
        format!("{}/.s.PGSQL.{}", one.host, one.port)
    } else {
        format!("{}:{}", one.host, one.port)
    }
}

/// What one host gave.
enum Probe {
    /// The connect failed.
    Failed(ConnectError),
    /// It logged in, but its role could not be learnt: why.
    Unclear(String),
    /// It logged in. Its role (None: not asked, for `any`), and its cluster and timeline
    /// when it would be taken as a primary and told them.
    Up { conn: Box<ServerConn>, role: Option<Role>, fence: Option<(String, u32)> },
}

/// Connects to one host and learns what the choice needs: its role, and for a server that
/// would be taken as a primary its cluster and timeline (`FENCE_QUERY`).
async fn probe(
    one: &ServerTarget,
    creds: &Credentials,
    timeout: Duration,
    attrs: TargetSessionAttrs,
    place: &str,
) -> Probe {
    let mut conn = match server_conn::connect(one, creds, timeout).await {
        Ok(c) => c,
        Err(e) => return Probe::Failed(e),
    };
    if attrs == TargetSessionAttrs::Any {
        return Probe::Up { conn: Box::new(conn), role: None, fence: None };
    }
    let role = match Role::from_params(&conn.params) {
        Some(r) => r,
        None => match conn.query_rows(ROLE_QUERY, timeout).await {
            Ok(rows) => match rows.first().and_then(|r| Role::from_row(r)) {
                Some(r) => r,
                None => return Probe::Unclear("unexpected answer to the role query".to_owned()),
            },
            Err(e) => {
                tracing::warn!(host = %place, error = %e, "server role query failed");
                return Probe::Unclear(format!("role query failed: {e}"));
            }
        },
    };
    let fence = if role.fits(attrs) && takes_primary(attrs) { timeline(&mut conn, place, timeout).await } else { None };
    Probe::Up { conn: Box::new(conn), role: Some(role), fence }
}

/// Asks a server that would be taken as a primary for its cluster and timeline. None when
/// it cannot tell (the query failed, e.g. not allowed): it is then taken unchecked, parsnip
/// knowing nothing newer of it.
async fn timeline(conn: &mut ServerConn, place: &str, timeout: Duration) -> Option<(String, u32)> {
    let rows = match conn.query_rows(FENCE_QUERY, timeout).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!(host = %place, error = %e, "timeline query failed: the server is not fenced");
            return None;
        }
    };
    let row = rows.first();
    let field = |i: usize| row.and_then(|r| r.get(i)).and_then(|v| v.as_deref());
    let timeline = field(1).and_then(|t| t.parse::<u32>().ok())?;
    Some((field(0)?.to_owned(), timeline))
}

/// The verdict of `pool::fence` on a server that would be taken as a primary, for the
/// choice: Err (why) when a newer timeline of its cluster was seen, logged.
fn refusal(place: &str, timeline: u32, judged: Result<(), Seen>) -> Result<(), String> {
    let Err(newest) = judged else {
        return Ok(());
    };
    tracing::warn!(host = %place, timeline, newer_timeline = newest.timeline, newer_host = %newest.host,
        newer_port = newest.port, "a read-write server on an older timeline than one seen: refused as a primary \
         (an old primary back after a failover?); UNFENCE on the console takes it again");
    Err(format!(
        "fenced: read-write on timeline {timeline}, older than timeline {} seen on {}:{} (UNFENCE to accept it)",
        newest.timeline, newest.host, newest.port
    ))
}

/// Asks every host at once (each within `timeout`, the whole as well: a host that has not
/// answered by then is skipped) before choosing, for a pool that takes a primary from a
/// host list whose newest timeline parsnip does not know yet (first use, after `UNFENCE`
/// or after a reload changed the list): the answers of the read-write servers are judged
/// together (`pool::fence`), so the one on the newest timeline is taken whatever its place
/// in the list, and the older ones are fenced. Then chooses among the hosts in the usual
/// order; the other connections are closed.
async fn survey(
    target: &ServerTarget,
    creds: &Credentials,
    timeout: Duration,
    memory: &HostMemory,
) -> Result<ServerConn, ConnectError> {
    let attrs = target.attrs;
    let mut asked = tokio::task::JoinSet::new();
    for i in 0..target.hosts.len() {
        let (one, creds) = (target.at(i), creds.clone());
        asked.spawn(async move {
            let place = place(&one);
            (i, probe(&one, &creds, timeout, attrs, &place).await)
        });
    }
    let mut probes: Vec<Option<Probe>> = (0..target.hosts.len()).map(|_| None).collect();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            done = asked.join_next() => match done {
                Some(Ok((i, p))) => probes[i] = Some(p),
                Some(Err(e)) => tracing::warn!(error = %e, "a host's probe failed"),
                None => break,
            },
            _ = &mut deadline => break,
        }
    }
    asked.abort_all();
    for p in probes.iter_mut().filter(|p| p.is_none()) {
        *p = Some(Probe::Failed(ConnectError::Io(format!("no answer within {} ms", timeout.as_millis()))));
    }
    let answered: Vec<(usize, Answer)> = probes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Some(Probe::Up { fence: Some((system_id, timeline)), .. }) => {
                let (host, port) = target.hosts[i].clone();
                Some((i, Answer { host, port, system_id: system_id.clone(), timeline: *timeline }))
            }
            _ => None,
        })
        .collect();
    let answers: Vec<Answer> = answered.iter().map(|(_, a)| a.clone()).collect();
    let mut verdicts: Vec<Option<Result<(), Seen>>> = (0..probes.len()).map(|_| None).collect();
    for ((i, _), v) in answered.iter().zip(memory.fences.learn(&answers)) {
        verdicts[*i] = Some(v);
    }
    tracing::debug!(hosts = probes.len(), read_write = answers.len(), "surveyed the hosts before taking a primary");
    let order = memory.plan(&target.hosts, attrs, target.balance);
    let mut choice = Choice::new(target);
    let mut chosen: Option<Box<ServerConn>> = None;
    for i in order {
        let (one, Some(probe)) = (target.at(i), probes[i].take()) else {
            continue;
        };
        let place = place(&one);
        let verdict = match (verdicts[i].take(), &probe) {
            (Some(judged), Probe::Up { fence: Some((_, timeline)), .. }) => refusal(&place, *timeline, judged),
            _ => Ok(()),
        };
        if let Some(c) = choice.take(&one, &place, probe, verdict, memory) {
            match chosen {
                None => chosen = Some(c),
                Some(_) => {
                    tokio::spawn(c.terminate());
                }
            }
        }
    }
    match chosen {
        Some(c) => {
            memory.fences.surveyed(&target.hosts, answers.into_iter().map(|a| a.system_id).collect());
            Ok(*c)
        }
        None => choice.finish(),
    }
}

/// The choice among hosts as they are tried: the first that serves is taken; what the
/// others said makes the error when none does.
struct Choice {
    attrs: TargetSessionAttrs,
    several: bool,
    /// What each host said, for the error.
    tried: Vec<String>,
    /// The first server's own refusal (a wrong password, no such database).
    refused: Option<ConnectError>,
    /// prefer-standby: the first non-standby met.
    fallback: Option<Box<ServerConn>>,
    /// One host, and its error.
    only: Option<ConnectError>,
}

impl Choice {
    fn new(target: &ServerTarget) -> Choice {
        Choice {
            attrs: target.attrs,
            several: target.hosts.len() > 1,
            tried: Vec::new(),
            refused: None,
            fallback: None,
            only: None,
        }
    }

    /// What host `one` gave, with the fencing verdict on it; the connection when it is
    /// taken. What was learnt goes to `memory`.
    fn take(
        &mut self,
        one: &ServerTarget,
        place: &str,
        probe: Probe,
        verdict: Result<(), String>,
        memory: &HostMemory,
    ) -> Option<Box<ServerConn>> {
        let attrs = self.attrs;
        let (conn, role) = match probe {
            Probe::Failed(e) => {
                tracing::warn!(host = %place, error = %e, "server host failed");
                let starting_up = |e: &ConnectError| e.to_error().code == crate::error::SqlState::CANNOT_CONNECT_NOW;
                if matches!(e, ConnectError::Io(_) | ConnectError::Tls(_))
                    || matches!(&e, ConnectError::Server(_) if starting_up(&e))
                {
                    memory.down(&one.host, one.port);
                }
                let msg = e.to_string();
                self.tried.push(if msg.starts_with(place) { msg } else { format!("{place}: {msg}") });
                // The server's own refusal (a wrong password, no such database) says more
                // than "no host": it is what the client sees if no host serves.
                if self.refused.is_none() && matches!(e, ConnectError::Server(_) | ConnectError::Auth(_)) {
                    self.refused = Some(e);
                } else if !self.several {
                    self.only = Some(e);
                }
                return None;
            }
            Probe::Unclear(why) => {
                self.tried.push(format!("{place}: {why}"));
                return None;
            }
            Probe::Up { conn, role: None, .. } => return Some(conn),
            Probe::Up { conn, role: Some(role), .. } => (conn, role),
        };
        memory.role(&one.host, one.port, role);
        if role.fits(attrs) {
            if let Err(why) = verdict {
                memory.fenced(&one.host, one.port);
                self.tried.push(format!("{place}: {why}"));
                tokio::spawn(conn.terminate());
                return None;
            }
            tracing::debug!(host = %place, ?role, attrs = attrs.as_str(), "server host chosen");
            if let Some(f) = self.fallback.take() {
                tokio::spawn(f.terminate());
            }
            return Some(conn);
        }
        self.tried.push(format!("{place}: {}", role.why_not(attrs)));
        if attrs == TargetSessionAttrs::PreferStandby && self.fallback.is_none() {
            self.fallback = Some(conn);
        } else {
            tokio::spawn(conn.terminate());
        }
        None
    }

    /// No host was taken: prefer-standby's fallback, or the error.
    fn finish(self) -> Result<ServerConn, ConnectError> {
        if let Some(c) = self.fallback {
            tracing::debug!("no standby up: prefer-standby takes a primary");
            return Ok(*c);
        }
        if let Some(e) = self.refused {
            return Err(e);
        }
        if let Some(e) = self.only {
            // One host, and it failed: its error as it was.
            return Err(e);
        }
        Err(ConnectError::NoHost(format!(
            "no server suits target_session_attrs={}: {}",
            self.attrs.as_str(),
            if self.tried.is_empty() { "no host configured".to_owned() } else { self.tried.join("; ") }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadBalanceHosts;
    use std::sync::Arc;

    #[test]
    fn a_new_host_list_or_target_is_another_place_and_the_order_is_not() {
        let a = ServerTarget::plain("h", 1, "d", "u");
        let mut b = a.clone();
        b.balance = LoadBalanceHosts::Random;
        assert!(a.same_place(&b), "the order hosts are tried in applies to new connections only");
        b.attrs = TargetSessionAttrs::ReadWrite;
        assert!(!a.same_place(&b), "open connections may not suit the new target_session_attrs");
        let mut c = a.clone();
        c.hosts = Arc::from([("h".to_owned(), 1), ("g".to_owned(), 2)]);
        assert!(!a.same_place(&c));
        assert_eq!((c.at(1).host.as_str(), c.at(1).port), ("g", 2));
        assert_eq!((c.at(7).host.as_str(), c.at(7).port), ("h", 1), "out of range: unchanged");
    }

    #[tokio::test]
    async fn no_host_up_names_each_host() {
        let dead = |p: u16| ("127.0.0.1".to_owned(), p);
        let ports = [free(), free()];
        let mut t = ServerTarget::plain("127.0.0.1", ports[0], "d", "u");
        t.hosts = Arc::from([dead(ports[0]), dead(ports[1])]);
        t.attrs = TargetSessionAttrs::ReadWrite;
        let memory = HostMemory::default();
        let Err(e) = connect(&t, &Credentials::None, Duration::from_secs(2), &memory).await else {
            panic!("connected with no server up");
        };
        let err = e.to_error();
        assert_eq!(err.code.0, "08006");
        for p in ports {
            assert!(err.message.contains(&format!("127.0.0.1:{p}")), "{}", err.message);
        }
        assert!(err.message.starts_with("no server suits target_session_attrs=read-write"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_survey_skips_a_host_that_hangs_within_the_connect_timeout() {
        // A host that accepts TCP connections and never answers, and one that refuses.
        let hang = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let hp = hang.local_addr().expect("its address").port();
        let dp = free();
        let mut t = ServerTarget::plain("127.0.0.1", hp, "d", "u");
        t.hosts = Arc::from([("127.0.0.1".to_owned(), hp), ("127.0.0.1".to_owned(), dp)]);
        t.attrs = TargetSessionAttrs::Primary;
        let memory = HostMemory::default();
        assert!(!memory.fences.known(&t.hosts));
        let timeout = Duration::from_millis(300);
        let t0 = std::time::Instant::now();
        let Err(e) = connect(&t, &Credentials::None, timeout, &memory).await else {
            panic!("connected with no server up");
        };
        let took = t0.elapsed();
        assert!(took >= timeout && took < timeout + Duration::from_millis(200), "{took:?}");
        let err = e.to_error();
        assert!(err.message.contains(&format!("127.0.0.1:{hp}: no answer within 300 ms")), "{}", err.message);
        assert!(err.message.contains(&format!("127.0.0.1:{dp}")), "{}", err.message);
        assert!(!memory.fences.known(&t.hosts), "nothing taken: surveyed again next time");
        drop(hang);
    }

    fn free() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a port")
    }
}
