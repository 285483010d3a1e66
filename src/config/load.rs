//! Reading the configuration file from disk: parsnip's TOML, or a pgbouncer.ini (given
//! with `--pgbouncer-ini`, or with `-c` and recognised by its `.ini` extension or a
//! `[pgbouncer]` section), whose `%include` and `auth_file` are read here for the pure
//! `ini` and `pgbouncer` modules; and writing a configuration back as TOML
//! (`--print-config`).

use super::ini::{self, Included};
use super::pgbouncer;
use super::{AuthType, Config, ConfigError};
use std::path::{Path, PathBuf};

/// Whether the file at `path` is a pgbouncer.ini rather than parsnip's TOML.
pub(crate) fn looks_like_ini(path: &Path, text: &str) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("ini"))
        || text.lines().any(|l| {
            let l = l.trim();
            l.eq_ignore_ascii_case("[pgbouncer]") || l.starts_with("%include")
        })
}

/// A file an ini names, as PgBouncer finds it (an absolute path, or relative to the
/// working directory), else relative to the directory of the main ini (as if PgBouncer had
/// been started there): the same directory for every file, included ones too.
fn locate(path: &str, main: &Path) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() || p.exists() {
        return p.to_path_buf();
    }
    main.parent().map_or_else(|| p.to_path_buf(), |dir| dir.join(p))
}

fn read_named(path: &str, main: &Path) -> Result<Included, String> {
    let p = locate(path, main);
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    let name = std::fs::canonicalize(&p).unwrap_or(p).display().to_string();
    Ok(Included { name, text })
}

impl Config {
    /// Reads a configuration file (not validated: flags may still change it): TOML, or a
    /// pgbouncer.ini when `ini` says so or the file looks like one. An ini setting parsnip
    /// cannot honour is an error unless `lenient`; what was left out is in `load_notes`.
    pub(crate) fn read_file(path: &Path, ini: bool, lenient: bool) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        if ini || looks_like_ini(path, &text) {
            return Self::from_pgbouncer_ini(path, &text, lenient);
        }
        toml::from_str(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
    }

    fn from_pgbouncer_ini(path: &Path, text: &str, lenient: bool) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let fail = |e: String| ConfigError(format!("{name}: {e}"));
        let mut read = |p: &str, _from: &str| read_named(p, path);
        let lines = ini::parse(&name, text, &mut read).map_err(fail)?;
        let tr = pgbouncer::translate(&lines, &mut read).map_err(fail)?;
        let refused: Vec<String> = tr.notes.iter().filter(|n| n.refused).map(|n| format!("  {n}")).collect();
        if !refused.is_empty() && !lenient {
            return Err(ConfigError(format!(
                "{name}: settings parsnip cannot honour (--lenient starts without them):\n{}",
                refused.join("\n")
            )));
        }
        let mut cfg: Config = toml::Value::Table(tr.table)
            .try_into()
            .map_err(|e: toml::de::Error| fail(format!("as parsnip's configuration: {e}")))?;
        cfg.load_notes = tr.notes.iter().map(ToString::to_string).collect();
        // Found as the ini's other files are (the TOML then names it where it is).
        if let Some(hba) = &cfg.auth_hba_file {
            cfg.auth_hba_file = Some(locate(hba, path).display().to_string());
        }
        if let Some(ident) = &cfg.auth_ident_file {
            cfg.auth_ident_file = Some(locate(ident, path).display().to_string());
        }
        Ok(cfg)
    }

    /// Reads `auth_hba_file` and `auth_ident_file` when `auth_type` is hba (at start and at
    /// each reload, as PgBouncer re-reads them; an `@file` the hba file names is relative
    /// to its directory), and `auth_ldap_options` when it is ldap.
    pub(crate) fn read_hba(&mut self) -> Result<(), ConfigError> {
        self.hba = None;
        self.ident = None;
        self.ldap = None;
        if let (AuthType::Ldap, Some(opts)) = (self.auth_type, &self.auth_ldap_options) {
            self.ldap = Some(std::sync::Arc::new(super::validate::ldap_options(opts)?));
        }
        if let (AuthType::Hba, Some(path)) = (self.auth_type, &self.auth_ident_file) {
            let fail = |e: String| ConfigError(format!("auth_ident_file {path}: {e}"));
            let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
            self.ident = Some(std::sync::Arc::new(crate::auth::ident::IdentMap::parse(&text).map_err(fail)?));
        }
        let (AuthType::Hba, Some(path)) = (self.auth_type, &self.auth_hba_file) else { return Ok(()) };
        let fail = |e: String| ConfigError(format!("auth_hba_file {path}: {e}"));
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let dir = Path::new(path).parent().map(Path::to_path_buf).unwrap_or_default();
        let mut read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| e.to_string());
        let hba = crate::auth::hba::Hba::parse(&text, &mut read).map_err(fail)?;
        // A map no line of the ident file has would refuse everyone its lines match: a typo.
        for (line, map) in hba.maps() {
            if !self.ident.as_ref().is_some_and(|i| i.has_map(map)) {
                return Err(fail(format!(
                    "line {line}: map={map} is not a map of auth_ident_file ({})",
                    self.auth_ident_file.as_deref().unwrap_or("not set")
                )));
            }
        }
        self.hba = Some(std::sync::Arc::new(hba));
        Ok(())
    }

    /// The configuration as parsnip's TOML file (`--print-config`); reading it back gives
    /// the same configuration. What an ini left out heads it as comments.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        let body = toml::to_string(self).map_err(|e| ConfigError(format!("printing the configuration: {e}")))?;
        let mut out = String::new();
        for n in &self.load_notes {
            out.push_str("# ");
            out.push_str(n);
            out.push('\n');
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&body);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_an_ini() {
        assert!(looks_like_ini(Path::new("/etc/pgbouncer/pgbouncer.INI"), ""));
        assert!(looks_like_ini(Path::new("conf"), "[databases]\n\n [PgBouncer]\nlisten_port = 1\n"));
        assert!(looks_like_ini(Path::new("conf"), "%include other\n"));
        assert!(!looks_like_ini(Path::new("p.toml"), "[databases.a]\nhost = 'h'\n"));
    }

    #[test]
    fn relative_names_from_the_working_directory_else_the_main_file() {
        let main = Path::new("/etc/pgb/p.ini");
        assert_eq!(locate("/abs/x", main), PathBuf::from("/abs/x"));
        assert_eq!(locate("Cargo.toml", main), PathBuf::from("Cargo.toml"), "the working directory");
        assert_eq!(locate("nope/users.txt", main), PathBuf::from("/etc/pgb/nope/users.txt"));
    }
}
