//! Online reload (SIGHUP, the console's `RELOAD`): the configuration is read again by the
//! loader the binary gave (`Reloader`), checked whole (TLS files included) before anything
//! changes, and swapped in once (the `LiveConfig` every pool and connector shares): logins,
//! timeouts and limits read the new one from then on; each pool takes its new size, target
//! and credentials (a database whose servers (host list), database name, user, password or
//! target_session_attrs changed has its open server connections closed as they come back,
//! as PgBouncer does; a new load_balance_hosts applies to new server connections;
//! read_write_split, max_replica_lag_ms and read_your_writes_ms apply at once to pools made
//! with a split, and a split turned on applies to pools created from then on); TLS
//! certificates and keys are re-read. A pool whose pool_mode changed is replaced for new
//! clients; its clients keep theirs. An invalid file changes nothing. No client is dropped:
//! a client in a transaction finishes it undisturbed. What each scalar key's change does is
//! its row's `Reload` in `config::KEYS`.

use super::Shared;
use super::login::server_side;
use super::servers::ServerPool;
use super::tls_config;
use crate::auth::Credentials;
use crate::config::{Config, Reload};
use crate::error::{Error, SqlState};
use crate::pool::PoolPurpose;
use std::sync::Arc;

/// How the binary re-reads its configuration, and what it does once one is applied (the
/// log filter).
pub struct Reloader {
    /// Reads the configuration again (the same file, flags and URL as at start).
    pub load: Box<dyn Fn() -> Result<Config, String> + Send + Sync>,
    /// Called with the configuration once it is applied.
    pub applied: Box<dyn Fn(&Config) + Send + Sync>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reloader")
    }
}

impl Shared {
    /// RELOAD and SIGHUP: re-reads and applies the configuration, or changes nothing and
    /// says why.
    pub(crate) fn reload(&self) -> Result<(), Error> {
        let fail = |why: String| {
            tracing::error!("reload failed, configuration unchanged: {why}");
            Error::new(SqlState::CONFIG_FILE_ERROR, format!("RELOAD failed, configuration unchanged: {why}"))
        };
        let Some(r) = self.reloader.get() else {
            return Err(fail("no configuration to re-read".into()));
        };
        let new = (r.load)().map_err(fail)?;
        self.apply(Arc::new(new)).map_err(fail)?;
        (r.applied)(&self.cfg.load());
        tracing::info!("configuration reloaded");
        Ok(())
    }

    /// Swaps `new` in (see the module doc).
    pub(crate) fn apply(&self, new: Arc<Config>) -> Result<(), String> {
        // Everything that can fail first: a bad certificate keeps the old configuration.
        let tls_clients = tls_config::for_clients(&new)?;
        let tls_servers = Arc::new(tls_config::for_servers(&new)?);
        let old = self.cfg.load_full();
        for k in crate::config::KEYS {
            let key = k.name;
            let (a, b) = ((k.show)(&old), (k.show)(&new));
            if a != b && k.reload == Reload::Restart {
                tracing::warn!("{key} changed ({a:?} to {b:?}): it takes effect after a restart");
            } else if a != b && k.reload == Reload::NewPools {
                tracing::warn!("{key} changed ({a:?} to {b:?}): pools created from now on use it");
            }
        }
        self.tls_clients.store(tls_clients);
        self.tls_servers.store(tls_servers.clone());
        self.cfg.store(new.clone());
        self.resize_client_slots(old.max_client_conn, new.max_client_conn);
        self.caps.set_limits(|db| new.db_limits(db), |user| new.user_limits(user));
        let pools: Vec<Arc<ServerPool>> =
            self.pools.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for p in pools {
            let lookup_db = if p.key.purpose == PoolPurpose::AuthQuery { "*" } else { p.key.db.as_str() };
            let Some((db_cfg, server_db)) = new.database(&p.key.db).or_else(|| new.database(lookup_db)) else {
                // Removed: its clients keep it; new ones are refused (3D000).
                tracing::info!(db = %p.key.db, "database removed: no new clients; connected ones stay");
                continue;
            };
            let user = &p.key.user;
            let (mut target, forced) = server_side(&new, db_cfg, &server_db, user, tls_servers.clone());
            if p.key.purpose == PoolPurpose::Reads {
                target.attrs = crate::config::TargetSessionAttrs::Standby;
            }
            if let Some(split) = p.connector().split() {
                split.configure(db_cfg);
            }
            let password = |c: &Config| c.users.get(user.as_str()).and_then(|u| u.password.clone());
            // The client's credentials, learnt at login: forgotten when the user's password
            // changed (the next login offers the new ones).
            let creds = forced.or_else(|| (password(&old) != password(&new)).then_some(Credentials::None));
            let changed = p.connector().retarget(target, creds);
            p.resize(new.pool_size_for(db_cfg, user));
            p.set_reserve(new.reserve_pool_size_for(db_cfg, user));
            if changed {
                let db = &p.key.db;
                tracing::info!(db = %db, user = %user, "database changed: server connections close as they come back");
                p.reconnect();
                if let Some(split) = p.connector().split() {
                    super::split::forget_probes(split);
                }
            }
            // The database's client_encoding, datestyle, timezone or application_name: the
            // defaults a pool learnt from its first connection and tells its clients.
            let old_params = old.database(&p.key.db).map(|(d, _)| d.default_params());
            let params_changed = old_params.is_some_and(|o| o != db_cfg.default_params());
            let mode_changed = p.mode != new.pool_mode_for(db_cfg, user);
            if p.key.purpose == PoolPurpose::Clients && (mode_changed || params_changed) {
                // Sessions keep the mode and defaults they started with: new clients get a
                // new pool.
                let what = if mode_changed { "pool_mode" } else { "the server parameters" };
                tracing::info!(db = %p.key.db, user = %user, "{what} changed: new clients get a new pool");
                let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
                pools.remove(&p.key);
                if let Some(split) = p.connector().split() {
                    pools.remove(&split.reads.key);
                    split.reads.reconnect();
                }
                drop(pools);
                p.reconnect();
            }
        }
        Ok(())
    }

    /// max_client_conn changed: as many permits more, or fewer (those held by connected
    /// clients are forgotten as they leave).
    fn resize_client_slots(&self, old: usize, new: usize) {
        if new > old {
            self.client_slots.add_permits(new - old);
        } else if new < old {
            let fewer = old - new;
            let gone = self.client_slots.forget_permits(fewer);
            if gone < fewer {
                let slots = self.client_slots.clone();
                tokio::spawn(async move {
                    if let Ok(p) = slots.acquire_many_owned((fewer - gone) as u32).await {
                        p.forget();
                    }
                });
            }
        }
    }
}
