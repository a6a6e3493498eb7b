//! MCP session records on disk (`state.directory`), so a client whose session the
//! gateway still honours keeps getting `get_section_source` answered after the sidecar
//! restarts, gracefully or by a crash.
//!
//! One file per session, `<sha256 of the id, hex>.json`, holding the id and what the
//! table keeps (owner, vault, the `initialize` token, effective user, role) and when it
//! last reached the gateway (format 2, `gateway_active_ms`). A format 1 record holds
//! `last_active_ms`, the last call of any kind, the sidecar's own answers included; it
//! is read as the gateway activity, the closest time it has: it can only be later than
//! the true one, which keeps a session the gateway may have dropped a little sooner,
//! and that session's first forwarded call settles it. Records are rewritten in format
//! 2 as the session is next seen at the gateway. Every write goes to a temporary file that is renamed over the
//! record, so a crash leaves either the old record or the new one, never a torn one;
//! leftover temporary files are removed at start. The directory is created (or narrowed
//! to) mode 0700 and records are mode 0600: they hold bearer tokens, readable by the
//! sidecar's user alone.
//!
//! One writer thread applies the changes in the order they were made, from a bounded
//! queue; a session's first record is written (and synced) before its `initialize`
//! answer leaves, so a crash right after cannot lose it. Later gateway activity is
//! written at most once a minute per session, and never synced: a crash loses at most
//! that minute of idle-time credit, which makes the restored session look older than it
//! is at the gateway (it then expires or is evicted sooner, never later).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use super::session::{valid_session_id, Session};
use crate::config::ConfigError;
use crate::telemetry::{Metrics, StoreOp};

/// Changes waiting for the writer; beyond this they are dropped and counted.
pub const QUEUE_CAPACITY: usize = 8192;

/// A record larger than this is not a record (a token fits in a header block).
const MAX_RECORD_BYTES: u64 = 128 * 1024;

/// Prefix of temporary files, never a record name (records are 64 hex digits).
const TEMP_PREFIX: &str = ".tmp-";

/// Record format version written.
const VERSION: u32 = 2;

/// The format before the gateway activity was kept apart (read, never written).
const VERSION_LAST_ACTIVE: u32 = 1;

/// One session as written to disk (format 2) or read (formats 1 and 2).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    v: u32,
    id: String,
    owner: String,
    vault: String,
    authorization: String,
    effective_user: String,
    role: String,
    /// Format 2: when the session last reached the gateway, in milliseconds since the
    /// Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway_active_ms: Option<u64>,
    /// Format 1: when the session was last used at all, in milliseconds since the Unix
    /// epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_active_ms: Option<u64>,
}

/// A session read back at start, with its last gateway activity on the wall clock.
#[derive(Debug)]
pub struct Restored {
    /// The session id.
    pub id: String,
    /// What the table keeps.
    pub session: Session,
    /// When it last reached the gateway (see the module doc for format 1 records).
    pub at_gateway: SystemTime,
}

enum Change {
    /// A new session: written, synced, then acknowledged.
    Create(Box<Record>, Option<oneshot::Sender<bool>>),
    /// Activity on a known session: rewritten only if its record still exists.
    Touch(Box<Record>),
    /// The session is gone.
    Remove(String),
}

/// The handle the session table writes through. Cloning it shares the writer.
#[derive(Clone)]
pub struct Store {
    dir: Arc<PathBuf>,
    queue: SyncSender<Change>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).finish()
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The file name of session `id`.
fn file_name(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    let mut name = String::with_capacity(69);
    for b in digest {
        name.push_str(&format!("{b:02x}"));
    }
    name.push_str(".json");
    name
}

#[cfg(unix)]
fn restrict_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

#[cfg(not(unix))]
fn restrict_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

fn create_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// What [`Store::open`] requires of `dir`, checked without leaving a trace, for
/// `check-config`: a directory that exists must take a new file; one that does not must
/// be creatable, and takes its mode. Whatever this creates (the directory, the parents it
/// needed, the probe) is removed again.
pub fn check(dir: &Path) -> Result<(), ConfigError> {
    const KEY: &str = "state.directory";
    let fail = |what: &str, e: io::Error| {
        ConfigError::new(KEY, format!("cannot {what} {}: {e}", dir.display()))
    };
    // The directories that do not exist yet, deepest first: removed again at the end.
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing.push(p.to_path_buf());
        at = p.parent();
    }
    let result = fs::create_dir_all(dir)
        .map_err(|e| fail("create", e))
        .and_then(|()| {
            if !missing.is_empty() {
                restrict_dir(dir).map_err(|e| fail("restrict the mode of", e))?;
            }
            let probe = dir.join(format!("{TEMP_PREFIX}check-{}", std::process::id()));
            let written = create_file(&probe).and_then(|mut f| f.write_all(b"{}"));
            let _ = fs::remove_file(&probe);
            written.map_err(|e| fail("write to", e))
        });
    for d in &missing {
        let _ = fs::remove_dir(d);
    }
    result
}

impl Store {
    /// Opens (creating, mode 0700) `dir`, removes leftover temporary files and checks it
    /// is writable; starts the writer thread.
    pub fn open(dir: &Path, metrics: Arc<Metrics>) -> Result<Store, ConfigError> {
        const KEY: &str = "state.directory";
        let fail = |what: &str, e: io::Error| {
            ConfigError::new(KEY, format!("cannot {what} {}: {e}", dir.display()))
        };
        let existed = dir.is_dir();
        fs::create_dir_all(dir).map_err(|e| fail("create", e))?;
        if let Err(e) = restrict_dir(dir) {
            // A directory someone else owns (a Kubernetes emptyDir is root's) keeps its
            // mode; the records in it are created 0600 all the same.
            if !existed {
                return Err(fail("restrict the mode of", e));
            }
            tracing::warn!(error = %e, "state.directory: cannot narrow its mode to 0700; records stay 0600");
        }
        for entry in fs::read_dir(dir).map_err(|e| fail("read", e))? {
            let entry = entry.map_err(|e| fail("read", e))?;
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
        let probe = dir.join(format!("{TEMP_PREFIX}probe"));
        create_file(&probe)
            .and_then(|mut f| f.write_all(b"{}"))
            .map_err(|e| fail("write to", e))?;
        let _ = fs::remove_file(&probe);

        let (queue, changes) = sync_channel::<Change>(QUEUE_CAPACITY);
        let writer_dir = dir.to_path_buf();
        let writer_metrics = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name("session-store".into())
            .spawn(move || {
                // Ends when every handle is dropped.
                for change in changes {
                    apply(&writer_dir, change, &writer_metrics);
                }
            })
            .map_err(|e| fail("start the writer for", e))?;
        Ok(Store {
            dir: Arc::new(dir.to_path_buf()),
            queue,
            metrics,
        })
    }

    /// Reads the records back: expired ones (idle at the gateway longer than `ttl`),
    /// unreadable ones and those beyond the `max` most recently active are deleted.
    pub fn load(&self, ttl: Duration, max: usize) -> Vec<Restored> {
        let now = SystemTime::now();
        let mut out = Vec::new();
        let Ok(entries) = fs::read_dir(self.dir.as_path()) else {
            self.metrics.session_store_error(StoreOp::Load);
            return out;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TEMP_PREFIX) {
                continue;
            }
            match read_record(&path, &name) {
                Some(r) if now.duration_since(r.at_gateway).unwrap_or_default() <= ttl => {
                    out.push(r)
                }
                Some(_) => {
                    let _ = fs::remove_file(&path);
                }
                None => {
                    self.metrics.session_store_error(StoreOp::Load);
                    let _ = fs::remove_file(&path);
                }
            }
        }
        out.sort_by_key(|r| std::cmp::Reverse(r.at_gateway));
        for stale in out.split_off(out.len().min(max)) {
            let _ = fs::remove_file(self.dir.join(file_name(&stale.id)));
        }
        out
    }

    fn send(&self, change: Change) -> bool {
        match self.queue.try_send(change) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.metrics.session_store_error(StoreOp::QueueFull);
                false
            }
            // The writer is gone (it never panics; only at exit).
            Err(TrySendError::Disconnected(_)) => {
                self.metrics.session_store_error(StoreOp::Write);
                false
            }
        }
    }

    /// Queues the first record of a session, opened at the gateway at `at_gateway`; the
    /// receiver says whether it is on disk.
    pub fn create(
        &self,
        id: &str,
        session: &Session,
        at_gateway: SystemTime,
    ) -> Option<oneshot::Receiver<bool>> {
        let (done, wait) = oneshot::channel();
        self.send(Change::Create(
            Box::new(record(id, session, at_gateway)?),
            Some(done),
        ))
        .then_some(wait)
    }

    /// Queues a newer gateway-activity time for a session already on disk.
    pub fn touch(&self, id: &str, session: &Session, at_gateway: SystemTime) {
        if let Some(r) = record(id, session, at_gateway) {
            self.send(Change::Touch(Box::new(r)));
        }
    }

    /// Queues the removal of a session's record.
    pub fn remove(&self, id: &str) {
        self.send(Change::Remove(id.to_owned()));
    }
}

fn record(id: &str, session: &Session, at_gateway: SystemTime) -> Option<Record> {
    Some(Record {
        v: VERSION,
        id: id.to_owned(),
        owner: session.owner.clone(),
        vault: session.vault.clone(),
        // Tokens are visible ASCII (they passed the header parser as a string).
        authorization: session.authorization.to_str().ok()?.to_owned(),
        effective_user: session.effective_user.clone(),
        role: session.role.clone(),
        gateway_active_ms: Some(unix_ms(at_gateway)),
        last_active_ms: None,
    })
}

fn read_record(path: &Path, name: &str) -> Option<Restored> {
    let file = File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return None;
    }
    let r: Record = serde_json::from_slice(&bytes).ok()?;
    // Each format holds its own time and not the other's.
    let at_gateway_ms = match (r.v, r.gateway_active_ms, r.last_active_ms) {
        (VERSION, Some(ms), None) | (VERSION_LAST_ACTIVE, None, Some(ms)) => ms,
        _ => return None,
    };
    // A record under another id's name was not written by this store.
    if !valid_session_id(&r.id) || file_name(&r.id) != name {
        return None;
    }
    let authorization = HeaderValue::from_str(&r.authorization).ok()?;
    Some(Restored {
        at_gateway: UNIX_EPOCH + Duration::from_millis(at_gateway_ms),
        session: Session {
            owner: r.owner,
            vault: r.vault,
            authorization,
            effective_user: r.effective_user,
            role: r.role,
        },
        id: r.id,
    })
}

/// Writes `r` under its name through a temporary file; `sync` makes it durable.
fn write_record(dir: &Path, r: &Record, sync: bool) -> io::Result<()> {
    let name = file_name(&r.id);
    let temp = dir.join(format!("{TEMP_PREFIX}{name}"));
    let bytes = serde_json::to_vec(r).map_err(io::Error::other)?;
    let _ = fs::remove_file(&temp);
    let written = create_file(&temp).and_then(|mut f| {
        f.write_all(&bytes)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    });
    let renamed = written.and_then(|()| fs::rename(&temp, dir.join(&name)));
    if renamed.is_err() {
        let _ = fs::remove_file(&temp);
    }
    renamed?;
    if sync {
        // The rename itself is durable once the directory is.
        File::open(dir).and_then(|d| d.sync_all())?;
    }
    Ok(())
}

fn apply(dir: &Path, change: Change, metrics: &Metrics) {
    match change {
        Change::Create(r, done) => {
            let ok = write_record(dir, &r, true).is_ok();
            if !ok {
                metrics.session_store_error(StoreOp::Write);
            }
            if let Some(done) = done {
                let _ = done.send(ok);
            }
        }
        Change::Touch(r) => {
            // A removed session stays removed: only an existing record is refreshed.
            if dir.join(file_name(&r.id)).exists() && write_record(dir, &r, false).is_err() {
                metrics.session_store_error(StoreOp::Write);
            }
        }
        Change::Remove(id) => match fs::remove_file(dir.join(file_name(&id))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => metrics.session_store_error(StoreOp::Remove),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "knowtation-sidecar-store-{tag}-{}-{}",
            std::process::id(),
            unix_ms(SystemTime::now())
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn session(owner: &str) -> Session {
        Session {
            owner: owner.into(),
            vault: "default".into(),
            authorization: HeaderValue::from_static("Bearer t.o.k"),
            effective_user: owner.into(),
            role: "viewer".into(),
        }
    }

    /// Returns once every change queued before it is applied (the writer is sequential).
    fn wait(store: &Store) {
        let rx = store
            .create("flush", &session("flush"), SystemTime::now())
            .unwrap();
        assert!(rx.blocking_recv().unwrap());
        fs::remove_file(store.dir.join(file_name("flush"))).unwrap();
    }

    #[test]
    fn records_survive_a_new_store_and_removed_ones_stay_removed() {
        let dir = temp_dir("roundtrip");
        let metrics = Arc::new(Metrics::new());
        let store = Store::open(&dir, Arc::clone(&metrics)).unwrap();
        let now = SystemTime::now();
        assert!(store
            .create("a", &session("u"), now)
            .unwrap()
            .blocking_recv()
            .unwrap());
        assert!(store
            .create("b", &session("v"), now)
            .unwrap()
            .blocking_recv()
            .unwrap());
        store.remove("b");
        // A touch after the removal must not bring it back.
        store.touch("b", &session("v"), now);
        store.touch("a", &session("u"), now + Duration::from_secs(30));
        wait(&store);
        drop(store);

        let again = Store::open(&dir, metrics).unwrap();
        let restored = again.load(Duration::from_secs(3600), 100);
        assert_eq!(restored.len(), 1);
        assert_eq!(restored[0].id, "a");
        assert_eq!(restored[0].session.owner, "u");
        assert_eq!(restored[0].session.authorization, "Bearer t.o.k");
        assert_eq!(
            unix_ms(restored[0].at_gateway),
            unix_ms(now + Duration::from_secs(30))
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn modes_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("modes");
        let store = Store::open(&dir, Arc::new(Metrics::new())).unwrap();
        assert!(store
            .create("a", &session("u"), SystemTime::now())
            .unwrap()
            .blocking_recv()
            .unwrap());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(file_name("a"))), 0o600);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn torn_foreign_expired_and_excess_records_are_dropped() {
        let dir = temp_dir("torn");
        let metrics = Arc::new(Metrics::new());
        let store = Store::open(&dir, Arc::clone(&metrics)).unwrap();
        let now = SystemTime::now();
        for (id, age) in [("new", 1), ("mid", 2), ("old", 3), ("expired", 7200)] {
            let t = now - Duration::from_secs(age);
            assert!(store
                .create(id, &session("u"), t)
                .unwrap()
                .blocking_recv()
                .unwrap());
        }
        drop(store);
        // A torn temporary file, a torn record and a record renamed to another id.
        fs::write(dir.join(format!("{TEMP_PREFIX}x")), b"{\"v\":1,\"id\"").unwrap();
        fs::write(dir.join(file_name("torn")), b"{\"v\":1,\"id\":\"to").unwrap();
        fs::copy(dir.join(file_name("new")), dir.join(file_name("other"))).unwrap();

        let store = Store::open(&dir, metrics).unwrap();
        let restored = store.load(Duration::from_secs(3600), 2);
        let ids: Vec<&str> = restored.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["new", "mid"]);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec![file_name("new"), file_name("mid")];
        want.sort();
        assert_eq!(left, want);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn format_1_records_are_read_and_each_format_holds_only_its_own_time() {
        let dir = temp_dir("formats");
        let metrics = Arc::new(Metrics::new());
        let store = Store::open(&dir, Arc::clone(&metrics)).unwrap();
        let now = SystemTime::now();
        assert!(store
            .create("new", &session("u"), now)
            .unwrap()
            .blocking_recv()
            .unwrap());
        drop(store);
        let written: Value =
            serde_json::from_slice(&fs::read(dir.join(file_name("new"))).unwrap()).unwrap();
        assert_eq!(written["v"], 2);
        assert_eq!(written["gateway_active_ms"], unix_ms(now));
        assert!(written.get("last_active_ms").is_none());

        // A record an earlier version wrote: its one time is taken as the gateway's.
        let old_ms = unix_ms(now - Duration::from_secs(90));
        let record = |v: u32, extra: &str, id: &str| {
            format!(
                r#"{{"v":{v},"id":"{id}","owner":"u","vault":"default","authorization":"Bearer t.o.k","effective_user":"u","role":"viewer"{extra}}}"#
            )
        };
        let v1 = format!(r#","last_active_ms":{old_ms}"#);
        fs::write(dir.join(file_name("v1")), record(1, &v1, "v1")).unwrap();
        // Mixed-up records were not written by any version: dropped.
        let v2 = format!(r#","gateway_active_ms":{old_ms}"#);
        let both = format!("{v1}{v2}");
        fs::write(dir.join(file_name("both")), record(2, &both, "both")).unwrap();
        fs::write(dir.join(file_name("v1-new")), record(1, &v2, "v1-new")).unwrap();
        fs::write(dir.join(file_name("v2-old")), record(2, &v1, "v2-old")).unwrap();
        fs::write(dir.join(file_name("v3")), record(3, &v1, "v3")).unwrap();

        let store = Store::open(&dir, metrics).unwrap();
        let restored = store.load(Duration::from_secs(3600), 100);
        let ids: Vec<&str> = restored.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["new", "v1"]);
        assert_eq!(unix_ms(restored[1].at_gateway), old_ms);
        // Expiry reads the same time: a format 1 record idle past the lifetime is gone.
        drop(store);
        let store = Store::open(&dir, Arc::new(Metrics::new())).unwrap();
        let restored = store.load(Duration::from_secs(60), 100);
        let ids: Vec<&str> = restored.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["new"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_directory_is_a_config_error() {
        let dir = temp_dir("file");
        fs::write(&dir, b"not a directory").unwrap();
        let err = Store::open(&dir, Arc::new(Metrics::new())).unwrap_err();
        assert_eq!(err.key, "state.directory");
        fs::remove_file(&dir).unwrap();
    }
}
