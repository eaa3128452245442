//! `tessera backup` and `tessera restore` as an operator runs them (the binary, beside a running server), and a
//! PostgreSQL database's round trip through `pg_dump` and `pg_restore`: what was acknowledged before the backup
//! began is in the copy, the audit log is the original's, the server starts on the restored database, and what
//! cannot be restored (a newer schema, a place that is not empty, a damaged file) is refused with nothing written.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::harness::TestApp;

/// Runs the `tessera` binary; its exit code, standard output and standard error.
async fn tessera(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env_remove("TESSERA_DATABASE_URL")
        .env_remove("TESSERA_DATA_DIR")
        .output()
        .await
        .expect("run tessera");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-{what}-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Every row of the audit log of the SQLite database at `path`, oldest first.
async fn audit_rows(path: &Path) -> Vec<(i64, i64, String, String, String, Option<String>, Option<String>)> {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.expect("open");
    let rows =
        sqlx::query_as("SELECT id, at_ms, actor, action, object, before_json, after_json FROM audit_log ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("audit log");
    pool.close().await;
    rows
}

/// Tenants created one after another by `writers` clients until `stop`; each name is kept with whether its
/// creation was acknowledged before `began` was set.
struct Load {
    acknowledged: Arc<Mutex<Vec<(String, bool)>>>,
    began: Arc<std::sync::atomic::AtomicBool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(app: &TestApp, writers: usize) -> Load {
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let began = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = (0..writers)
            .map(|w| {
                let (client, base, admin) = (app.client.clone(), app.base.clone(), app.admin.clone());
                let (acknowledged, began, stop) = (acknowledged.clone(), began.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let name = format!("w{w}-{n}");
                        n += 1;
                        let r = client
                            .post(format!("{base}/api/v1/tenants"))
                            .bearer_auth(&admin)
                            .json(&json!({ "name": name }))
                            .send()
                            .await
                            .expect("create");
                        assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
                        // Read after the answer: a creation acknowledged before the backup began reads `false`.
                        let after = began.load(std::sync::atomic::Ordering::SeqCst);
                        acknowledged.lock().expect("lock").push((name, !after));
                    }
                })
            })
            .collect();
        Load { acknowledged, began, stop, tasks }
    }

    async fn stop(self) -> Vec<(String, bool)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("writer");
        }
        Arc::try_unwrap(self.acknowledged).expect("one owner").into_inner().expect("lock")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_write_load_restores_with_every_acknowledged_write_and_the_audit_log() {
    let live = scratch_dir("live");
    let url = format!("sqlite://{}", live.join("tessera.db").display());
    let app = TestApp::sqlite().database_url(&url).start().await;
    let load = Load::start(&app, 4);
    tokio::time::sleep(Duration::from_millis(800)).await;

    // The backup, while four clients keep writing.
    let file = scratch_dir("backups").join("tessera.backup");
    load.began.store(true, std::sync::atomic::Ordering::SeqCst);
    let (code, out, err) =
        tessera(&["backup", "--data-dir", &live.display().to_string(), "--out", &file.display().to_string()]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("schema version") && out.contains("tessera restore"), "{out}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = load.stop().await;
    let before: Vec<&String> = written.iter().filter(|(_, b)| *b).map(|(n, _)| n).collect();
    let after = written.len() - before.len();
    assert!(
        before.len() >= 4 && after >= 1,
        "writes on both sides of the backup: {} before, {after} after",
        before.len()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).expect("backup").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the backup is private as the database is");
    }
    // A backup is never written over a file.
    let (code, _, err) =
        tessera(&["backup", "--data-dir", &live.display().to_string(), "--out", &file.display().to_string()]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("exists already"), "{err}");
    let original_audit = audit_rows(&live.join("tessera.db")).await;
    // The restored database has the original's users and tokens.
    let admin = app.admin.clone();
    drop(app);

    // Restored into an empty data dir; the server starts on it.
    let restored = scratch_dir("restored").join("data");
    let (code, out, err) =
        tessera(&["restore", "--data-dir", &restored.display().to_string(), &file.display().to_string()]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("Restored"), "{out}");
    let restored_audit = audit_rows(&restored.join("tessera.db")).await;
    assert!(!restored_audit.is_empty());
    assert_eq!(
        restored_audit[..],
        original_audit[..restored_audit.len()],
        "the restored audit log is the original's up to the backup, entry for entry"
    );
    let restored_url = format!("sqlite://{}", restored.join("tessera.db").display());
    let app = TestApp::sqlite().database_url(&restored_url).start().await;
    let (s, tenants) = app.get("/api/v1/tenants", &admin).await;
    assert_eq!(s, StatusCode::OK);
    let names: std::collections::HashSet<&str> =
        tenants.as_array().expect("tenants").iter().filter_map(|t| t["name"].as_str()).collect();
    let missing: Vec<&&String> = before.iter().filter(|n| !names.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "acknowledged before the backup began, missing after the restore: {missing:?}");
    for name in &before {
        let created = restored_audit
            .iter()
            .any(|r| r.3 == "tenant.create" && r.6.as_deref().is_some_and(|a| a.contains(name.as_str())));
        assert!(created, "the creation of {name} is in the restored audit log");
    }
    eprintln!(
        "{} tenants acknowledged before the backup, {after} after; {} audit entries restored",
        before.len(),
        restored_audit.len()
    );
    // The restored server takes writes.
    let (s, _) = app.send(Method::POST, "/api/v1/tenants", &admin, Some(json!({"name": "after-restore"}))).await;
    assert_eq!(s, StatusCode::CREATED);
    drop(app);

    // Refused, with nothing written: a place that is not empty, ...
    let (code, _, err) =
        tessera(&["restore", "--data-dir", &restored.display().to_string(), &file.display().to_string()]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("empty data dir"), "{err}");
    // ... a backup of a newer release, ...
    let newer = file.with_extension("newer");
    std::fs::copy(&file, &newer).expect("copy");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", newer.display())).await.expect("open");
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) VALUES (99990101000000, 'from the future', CURRENT_TIMESTAMP, 1, x'00', 0)")
        .execute(&pool)
        .await
        .expect("a newer migration");
    pool.close().await;
    let empty = scratch_dir("never");
    let (code, _, err) =
        tessera(&["restore", "--data-dir", &empty.display().to_string(), &newer.display().to_string()]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("does not know"), "{err}");
    assert!(!empty.join("tessera.db").exists(), "nothing written");
    // ... a file that is not a database, and PostgreSQL (its own tools).
    let junk = file.with_extension("junk");
    std::fs::write(&junk, b"not a database").expect("junk");
    let (code, _, err) =
        tessera(&["restore", "--data-dir", &empty.display().to_string(), &junk.display().to_string()]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a usable Tessera backup"), "{err}");
    assert!(!empty.join("tessera.db").exists(), "nothing written");
    let (code, _, err) =
        tessera(&["backup", "--database-url", "postgres://tessera:secret@db/tessera", "--out", "x.backup"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("pg_dump") && !err.contains("secret"), "{err}");
    for dir in [live, restored, empty, file.parent().expect("dir").to_path_buf()] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// PostgreSQL's own tools: a `pg_dump` of a database a server writes, restored with `pg_restore` into an empty
/// database, holds what was written, its audit log, and a server starts on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pg_dump_restored_into_an_empty_database_serves() {
    let Some(db) = crate::harness::ScratchDb::create("a_pg_dump_restored_into_an_empty_database_serves").await else {
        return;
    };
    let app = TestApp::sqlite().database_url(&db.url).start().await;
    for name in ["kept-a", "kept-b"] {
        let (s, _) = app.send(Method::POST, "/api/v1/tenants", &app.admin.clone(), Some(json!({ "name": name }))).await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let (_, audit) = app.get("/api/v1/audit/entries?limit=500", &app.admin).await;
    let admin = app.admin.clone();
    let dump = scratch_dir("pg-dump").join("tessera.dump");
    let out = tokio::process::Command::new("pg_dump")
        .args(["--format=custom", "--file", &dump.display().to_string(), &db.url])
        .output()
        .await
        .expect("pg_dump (Debian's postgresql-client) is installed where PostgreSQL's tests run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    drop(app);

    let Some(target) = crate::harness::ScratchDb::create("the pg_restore target").await else { return };
    let out = tokio::process::Command::new("pg_restore")
        .args(["--no-owner", "--exit-on-error", "--dbname", &target.url, &dump.display().to_string()])
        .output()
        .await
        .expect("pg_restore");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let app = TestApp::sqlite().database_url(&target.url).start().await;
    let (_, tenants) = app.get("/api/v1/tenants", &admin).await;
    for name in ["kept-a", "kept-b"] {
        assert!(tenants.as_array().expect("tenants").iter().any(|t| t["name"] == name), "{name} restored: {tenants}");
    }
    let (_, restored_audit) = app.get("/api/v1/audit/entries?limit=500", &admin).await;
    assert_eq!(restored_audit["entries"], audit["entries"], "the audit log, entry for entry");
    assert!(audit["entries"].as_array().is_some_and(|e| !e.is_empty()), "{audit}");
    let (s, _) = app.send(Method::POST, "/api/v1/tenants", &admin, Some(json!({"name": "after"}))).await;
    assert_eq!(s, StatusCode::CREATED, "the restored database takes writes (its sequences restored too)");
    drop(app);
    let _ = std::fs::remove_dir_all(dump.parent().expect("dir"));
    target.drop().await;
    db.drop().await;
}
