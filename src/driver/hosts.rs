//! Opening a server connection to one of a database's hosts (libpq's multi-host
//! connections): hosts tried in the order `pool::hosts::HostMemory::plan` gives, each
//! within the connect timeout; with a `target_session_attrs` other than `any`, the role of
//! each server that logs in is read from the ParameterStatus it sent at login
//! (`in_hot_standby` and `default_transaction_read_only`, PostgreSQL 14 on) or, failing
//! that, asked with one query; a server of the wrong role is closed and the next host
//! tried. prefer-standby keeps the first non-standby it met in case no standby is up.
//! What was learnt (down, role) goes to the shared `HostMemory`.

use super::server_conn::{self, ConnectError, ServerConn, ServerTarget};
use crate::auth::Credentials;
use crate::config::TargetSessionAttrs;
use crate::pool::fence::FENCE_QUERY;
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
    let mut tried: Vec<String> = Vec::new();
    let mut refused: Option<ConnectError> = None;
    let mut fallback: Option<ServerConn> = None;
    let mut only: Option<ConnectError> = None;
    for i in memory.plan(&target.hosts, attrs, target.balance) {
        let one = target.at(i);
        let place = if one.host.starts_with('/') {
            format!("{}/.s.PGSQL.{}", one.host, one.port)
        } else {
            format!("{}:{}", one.host, one.port)
        };
        let mut conn = match server_conn::connect(&one, creds, timeout).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(host = %place, error = %e, "server host failed");
                let starting_up = |e: &ConnectError| e.to_error().code == crate::error::SqlState::CANNOT_CONNECT_NOW;
                if matches!(e, ConnectError::Io(_) | ConnectError::Tls(_))
                    || matches!(&e, ConnectError::Server(_) if starting_up(&e))
                {
                    memory.down(&one.host, one.port);
                }
                let msg = e.to_string();
                tried.push(if msg.starts_with(&place) { msg } else { format!("{place}: {msg}") });
                // The server's own refusal (a wrong password, no such database) says more
                // than "no host": it is what the client sees if no host serves.
                if refused.is_none() && matches!(e, ConnectError::Server(_) | ConnectError::Auth(_)) {
                    refused = Some(e);
                } else if target.hosts.len() < 2 {
                    only = Some(e);
                }
                continue;
            }
        };
        if attrs == TargetSessionAttrs::Any {
            return Ok(conn);
        }
        let role = match Role::from_params(&conn.params) {
            Some(r) => r,
            None => match conn.query_rows(ROLE_QUERY, timeout).await {
                Ok(rows) => match rows.first().and_then(|r| Role::from_row(r)) {
                    Some(r) => r,
                    None => {
                        tried.push(format!("{place}: unexpected answer to the role query"));
                        continue;
                    }
                },
                Err(e) => {
                    tracing::warn!(host = %place, error = %e, "server role query failed");
                    tried.push(format!("{place}: role query failed: {e}"));
                    continue;
                }
            },
        };
        memory.role(&one.host, one.port, role);
        if role.fits(attrs)
            && matches!(attrs, TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary)
            && let Err(why) = fence(&mut conn, &one.host, one.port, &place, timeout, memory).await
        {
            tried.push(format!("{place}: {why}"));
            tokio::spawn(Box::new(conn).terminate());
            continue;
        }
        if role.fits(attrs) {
            tracing::debug!(host = %place, ?role, attrs = attrs.as_str(), "server host chosen");
            if let Some(f) = fallback {
                tokio::spawn(Box::new(f).terminate());
            }
            return Ok(conn);
        }
        tried.push(format!("{place}: {}", role.why_not(attrs)));
        if attrs == TargetSessionAttrs::PreferStandby && fallback.is_none() {
            fallback = Some(conn);
        } else {
            tokio::spawn(Box::new(conn).terminate());
        }
    }
    if let Some(c) = fallback {
        tracing::debug!("no standby up: prefer-standby takes a primary");
        return Ok(c);
    }
    if let Some(e) = refused {
        return Err(e);
    }
    if let Some(e) = only {
        // One host, and it failed: its error as it was.
        return Err(e);
    }
    Err(ConnectError::NoHost(format!(
        "no server suits target_session_attrs={}: {}",
        attrs.as_str(),
        if tried.is_empty() { "no host configured".to_owned() } else { tried.join("; ") }
    )))
}

/// Asks a server that would be taken as a primary for its cluster and timeline, and
/// refuses it (Err: why) when a newer timeline of its cluster was seen (`pool::fence`).
/// A server that cannot tell (the query failed, e.g. not allowed) is taken: parsnip then
/// knows nothing newer of it.
async fn fence(
    conn: &mut ServerConn,
    host: &str,
    port: u16,
    place: &str,
    timeout: Duration,
    memory: &HostMemory,
) -> Result<(), String> {
    let rows = match conn.query_rows(FENCE_QUERY, timeout).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!(host = %place, error = %e, "timeline query failed: the server is not fenced");
            return Ok(());
        }
    };
    let row = rows.first();
    let field = |i: usize| row.and_then(|r| r.get(i)).and_then(|v| v.as_deref());
    let (Some(system_id), Some(timeline)) = (field(0), field(1).and_then(|t| t.parse::<u32>().ok())) else {
        return Ok(());
    };
    match memory.fences.check(host, port, system_id, timeline) {
        Ok(()) => Ok(()),
        Err(newest) => {
            tracing::warn!(host = %place, timeline, newer_timeline = newest.timeline, newer_host = %newest.host,
                newer_port = newest.port, "a read-write server on an older timeline than one seen: refused as a primary \
                 (an old primary back after a failover?); UNFENCE on the console takes it again");
            memory.fenced(host, port);
            Err(format!(
                "fenced: read-write on timeline {timeline}, older than timeline {} seen on {}:{} (UNFENCE to accept it)",
                newest.timeline, newest.host, newest.port
            ))
        }
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

    fn free() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a port")
    }
}
