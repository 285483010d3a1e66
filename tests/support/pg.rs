//! A tokio-postgres client whose connection task forwards NOTICEs and reports how the
//! connection ended, and error helpers.

#![allow(dead_code)]

use super::*;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, NoTls, error::DbError};

/// A tokio-postgres client plus its connection task.
pub struct Pg {
    pub client: Client,
    /// NOTICEs (and other non-error async notices) received on this connection.
    pub notices: tokio::sync::mpsc::UnboundedReceiver<DbError>,
    /// How the connection ended: Ok on a clean close, Err with e.g. a FATAL from the server.
    pub task: JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl std::ops::Deref for Pg {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Pg {
    /// Connects to 127.0.0.1:`port`.
    pub async fn connect(port: u16, user: &str, password: Option<&str>, db: &str) -> Result<Pg, tokio_postgres::Error> {
        let mut cfg = pg_config(port, user, password, db);
        Self::connect_config(&mut cfg).await
    }

    /// Connects with a prepared configuration.
    pub async fn connect_config(cfg: &mut tokio_postgres::Config) -> Result<Pg, tokio_postgres::Error> {
        let (client, mut conn) = cfg.connect(NoTls).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notice(n))) => {
                        let _ = tx.send(n);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e),
                    None => return Ok(()),
                }
            }
        });
        Ok(Pg { client, notices: rx, task })
    }

    /// Closes the socket abruptly (no Terminate message), as a crashed client would.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        drop(self.client);
    }

    /// Waits (bounded) for the server side to end the connection; returns how it ended.
    pub async fn ended(self, dur: Duration) -> Result<Result<(), tokio_postgres::Error>, String> {
        let Pg { client, task, .. } = self;
        let r = within(dur, task).await;
        drop(client);
        r.map(|j| j.expect("connection task panicked"))
    }

    /// First column of the first row of a simple query, as text.
    pub async fn scalar(&self, sql: &str) -> Result<String, tokio_postgres::Error> {
        let msgs = self.client.simple_query(sql).await?;
        for m in msgs {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                return Ok(r.get(0).unwrap_or("NULL").to_string());
            }
        }
        Ok(String::new())
    }
}

/// A tokio-postgres configuration for 127.0.0.1:`port`.
pub fn pg_config(port: u16, user: &str, password: Option<&str>, db: &str) -> tokio_postgres::Config {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1").port(port).user(user).dbname(db).connect_timeout(Duration::from_secs(10));
    if let Some(pw) = password {
        cfg.password(pw);
    }
    cfg
}

/// SQLSTATE of a tokio-postgres error, if it came from the server (or pooler).
pub fn sqlstate(e: &tokio_postgres::Error) -> Option<String> {
    e.as_db_error().map(|d| d.code().code().to_string())
}

/// "CODE SEVERITY: message" or the error's Display.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} {}: {}", d.code().code(), d.severity(), d.message()),
        None => format!("{e} ({e:?})"),
    }
}

/// Asserts that `r` failed with `code`; returns the server's error.
pub fn expect_code<T: std::fmt::Debug>(r: Result<T, tokio_postgres::Error>, code: &str, context: &str) -> DbError {
    match r {
        Ok(v) => panic!("{context}: expected SQLSTATE {code}, got success {v:?}"),
        Err(e) => match e.as_db_error() {
            Some(d) if d.code().code() == code => d.clone(),
            _ => panic!("{context}: expected SQLSTATE {code}, got {}", describe(&e)),
        },
    }
}

/// A row of a console command's result, as column name → value (NULL: None).
pub type Row = std::collections::HashMap<String, Option<String>>;

/// The rows of a console command (`SHOW …`) run on `console`; panics on an error.
pub async fn console_rows(console: &Pg, sql: &str) -> Vec<Row> {
    let msgs = console.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    msgs.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                r.columns()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.name().to_owned(), r.get(i).map(str::to_owned)))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
