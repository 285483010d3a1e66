//! What a pool learns once and shares with all its clients: the server's startup
//! parameters (`ServerDefaults`, from the first connection, told to every new client at
//! login) and one shared copy of each distinct set of client settings (`intern_settings`).

use super::{Connector, Pool, Pooled};
use crate::error::Error;
use crate::state::settings::{Settings, TRACKED};
use std::sync::Arc;

/// What a new client is told about the server at login, learnt from the first connection.
#[derive(Debug)]
pub(crate) struct ServerDefaults {
    /// Every ParameterStatus the server sent at startup.
    pub(crate) params: Vec<(String, String)>,
    /// The tracked subset, as session settings.
    pub(crate) settings: Settings,
}

impl<K: Connector> Pool<K> {
    /// The server's startup parameters, connecting once if none is known yet.
    pub(crate) async fn defaults(&self) -> Result<Arc<ServerDefaults>, Error> {
        if let Some(d) = self.defaults.get() {
            return Ok(d.clone());
        }
        let conn = self.acquire().await?;
        let d = self.learn_defaults(&conn);
        self.release_now(conn, true);
        Ok(d)
    }

    pub(super) fn learn_defaults(&self, conn: &K::Conn) -> Arc<ServerDefaults> {
        self.defaults
            .get_or_init(|| {
                let mut settings = Settings::default();
                for name in TRACKED {
                    settings.set_reported(name, conn.settings().reported(name).unwrap_or(""));
                }
                Arc::new(ServerDefaults { params: conn.startup_params().to_vec(), settings })
            })
            .clone()
    }

    /// One shared copy of `s` for every client of this pool with the same settings, so an
    /// idle client costs a pointer, not a copy.
    pub(crate) fn intern_settings(&self, s: Settings) -> Arc<Settings> {
        let mut map = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shared) = map.get(&s.key()).and_then(std::sync::Weak::upgrade)
            && *shared == s
        {
            return shared;
        }
        if map.len() >= 1024 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let a = Arc::new(s);
        map.insert(a.key(), Arc::downgrade(&a));
        a
    }
}
