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
                if matches!(e, ConnectError::Io(_) | ConnectError::Tls(_))
                    || matches!(&e, ConnectError::Server(_) if e.to_error().code == crate::error::SqlState::CANNOT_CONNECT_NOW)
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
