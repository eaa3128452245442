//! Upgrading a database made by an earlier release keeps its data, on both backends.
//!
//! Each test builds the schema as the release before one convention for times shipped it (PostgreSQL's migrations
//! up to 0013, with `timestamptz` columns and 32-bit integers; SQLite's up to 0012), writes rows the way that
//! release wrote them, then opens the database with today's store, which migrates it, and reads every row back
//! through the store: every time to the millisecond, every index and start, every JSON document.

use std::path::{Path, PathBuf};

use sqlx::migrate::Migrator;
use tessera_server::store::Store;

use crate::harness::ScratchDb;

/// Times that do not fall on a whole second, as a release wrote them.
const CREATED: i64 = 1_700_000_000_123;
const UPDATED: i64 = 1_700_000_060_457;
const EXPIRES: i64 = 1_700_003_600_999;
const REVOKED: i64 = 1_700_000_120_001;

/// A folder holding the backend's migrations numbered up to `last`, as an earlier release shipped them.
fn migrations_up_to(backend: &str, last: u32) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(backend);
    let to = std::env::temp_dir().join(format!("tessera-migrations-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&to).expect("temp dir");
    let mut copied = 0;
    for entry in std::fs::read_dir(&from).expect("migrations") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let number: u32 = name.split('_').next().and_then(|n| n.parse().ok()).unwrap_or(u32::MAX);
        if number <= last {
            std::fs::copy(&path, to.join(&name)).expect("copy migration");
            copied += 1;
        }
    }
    assert!(copied >= 11, "found only {copied} migrations in {}", from.display());
    to
}

/// The rows an earlier release wrote, with its column names and types; `$n` bind order as listed in each call.
const OLD_POSTGRES_ROWS: &[&str] = &[
    "INSERT INTO tenants (id, name, auto_approve, auto_approve_max_compute_slices, created_at) \
     VALUES ('t1', 'vision', TRUE, 7, to_timestamp(1700000000123::double precision / 1000.0))",
    "INSERT INTO users (id, name, platform_admin, created_at) \
     VALUES ('u1', 'alice', FALSE, to_timestamp(1700000000123::double precision / 1000.0))",
    "INSERT INTO api_tokens (id, user_id, name, secret_sha256, created_at, revoked_at) \
     VALUES ('k1', 'u1', 'laptop', 'sha', to_timestamp(1700000000123::double precision / 1000.0), \
     to_timestamp(1700000120001::double precision / 1000.0))",
    "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at, updated_at, \
     duration_s, expires_at) VALUES ('r1', 't1', '{\"mode\":\"mig\",\"profile\":\"1g.10gb\"}', 2, 'active', \
     'training', 3, to_timestamp(1700000000123::double precision / 1000.0), \
     to_timestamp(1700000060457::double precision / 1000.0), 3600, \
     to_timestamp(1700003600999::double precision / 1000.0))",
    "INSERT INTO audit_log (at, actor, action, object, before_json, after_json) \
     VALUES (to_timestamp(1700000060457::double precision / 1000.0), 'user:alice', 'request.create', 'request/r1', \
     NULL, '{\"id\":\"r1\"}'::jsonb)",
    "INSERT INTO nodes (id, name, created_at) \
     VALUES ('n1', 'gpu-01', to_timestamp(1700000000123::double precision / 1000.0))",
    "INSERT INTO gpus (id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version) \
     VALUES ('g1', 'n1', 3, 'GPU-1', 'A100-SXM4-80GB', TRUE, FALSE, \
     '[{\"profile\":\"1g.10gb\",\"start\":6}]'::jsonb, 2)",
    "INSERT INTO layout_proposals (id, gpu_id, base_version, layout, created, destroyed, state, reason, created_by, \
     decided_by, created_at, decided_at) VALUES ('p1', 'g1', 1, '[{\"profile\":\"1g.10gb\",\"start\":6}]'::jsonb, \
     '[{\"profile\":\"1g.10gb\",\"start\":6}]'::jsonb, '[]'::jsonb, 'approved', '', 'user:admin', 'auto-layout', \
     to_timestamp(1700000000123::double precision / 1000.0), \
     to_timestamp(1700000060457::double precision / 1000.0))",
    "INSERT INTO allocations (id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id, created_at) \
     VALUES ('a1', 'r1', 't1', 'g1', '1g.10gb', 6, 'active', 'p1', \
     to_timestamp(1700000060457::double precision / 1000.0))",
];

/// The same rows as the SQLite schema of that release holds them.
const OLD_SQLITE_ROWS: &[&str] = &[
    "INSERT INTO tenants (id, name, auto_approve, auto_approve_max_compute_slices, created_at_ms) \
     VALUES ('t1', 'vision', 1, 7, 1700000000123)",
    "INSERT INTO users (id, name, platform_admin, created_at_ms) VALUES ('u1', 'alice', 0, 1700000000123)",
    "INSERT INTO api_tokens (id, user_id, name, secret_sha256, created_at_ms, revoked_at_ms) \
     VALUES ('k1', 'u1', 'laptop', 'sha', 1700000000123, 1700000120001)",
    "INSERT INTO slice_requests (id, tenant_id, spec, count, state, reason, version, created_at_ms, updated_at_ms, \
     duration_s, expires_at_ms) VALUES ('r1', 't1', '{\"mode\":\"mig\",\"profile\":\"1g.10gb\"}', 2, 'active', \
     'training', 3, 1700000000123, 1700000060457, 3600, 1700003600999)",
    "INSERT INTO audit_log (at_ms, actor, action, object, before_json, after_json) \
     VALUES (1700000060457, 'user:alice', 'request.create', 'request/r1', NULL, '{\"id\":\"r1\"}')",
    "INSERT INTO nodes (id, name, created_at_ms) VALUES ('n1', 'gpu-01', 1700000000123)",
    "INSERT INTO gpus (id, node_id, idx, uuid, model, mig_enabled, cordoned, layout, layout_version) \
     VALUES ('g1', 'n1', 3, 'GPU-1', 'A100-SXM4-80GB', 1, 0, '[{\"profile\":\"1g.10gb\",\"start\":6}]', 2)",
    "INSERT INTO layout_proposals (id, gpu_id, base_version, layout, created, destroyed, state, reason, created_by, \
     decided_by, created_at_ms, decided_at_ms) VALUES ('p1', 'g1', 1, '[{\"profile\":\"1g.10gb\",\"start\":6}]', \
     '[{\"profile\":\"1g.10gb\",\"start\":6}]', '[]', 'approved', '', 'user:admin', 'auto-layout', \
     1700000000123, 1700000060457)",
    "INSERT INTO allocations (id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id, created_at_ms) \
     VALUES ('a1', 'r1', 't1', 'g1', '1g.10gb', 6, 'active', 'p1', 1700000060457)",
];

/// Reads every row back through today's store.
async fn assert_carried_over(store: &Store) {
    let tenant = store.tenant("t1").await.expect("tenant");
    assert_eq!((tenant.name.as_str(), tenant.created_at_ms), ("vision", CREATED));
    assert!(tenant.policy.auto_approve);
    assert_eq!(tenant.policy.auto_approve_max_compute_slices, 7);

    let users = store.users().await.expect("users");
    assert_eq!(users.len(), 1);
    assert_eq!((users[0].name.as_str(), users[0].created_at_ms), ("alice", CREATED));
    let tokens = store.tokens("u1").await.expect("tokens");
    assert_eq!(tokens.len(), 1);
    assert_eq!((tokens[0].created_at_ms, tokens[0].revoked_at_ms), (CREATED, Some(REVOKED)));

    let r = store.request("r1").await.expect("request");
    assert_eq!((r.created_at_ms, r.updated_at_ms, r.expires_at_ms), (CREATED, UPDATED, Some(EXPIRES)));
    assert_eq!((r.count, r.version, r.duration_s, r.reason.as_str()), (2, 3, Some(3600), "training"));
    assert_eq!(serde_json::to_value(&r.spec).expect("spec")["profile"], "1g.10gb");

    let audit = store.audit("request/r1").await.expect("audit");
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].at_ms, audit[0].action.as_str()), (UPDATED, "request.create"));
    let after: serde_json::Value = serde_json::from_str(audit[0].after.as_deref().expect("after")).expect("json");
    assert_eq!(after["id"], "r1");

    let nodes = store.nodes().await.expect("nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!((nodes[0].name.as_str(), nodes[0].created_at_ms), ("gpu-01", CREATED));
    let gpu = &nodes[0].gpus[0];
    assert_eq!((gpu.index, gpu.layout_version, gpu.layout.len(), gpu.layout[0].start), (3, 2, 1, 6));

    let proposals = store.proposals(None).await.expect("proposals");
    assert_eq!(proposals.len(), 1);
    assert_eq!((proposals[0].created_at_ms, proposals[0].decided_at_ms), (CREATED, Some(UPDATED)));
    assert_eq!(proposals[0].created[0].start, 6);

    let live = store.live_allocations().await.expect("allocations");
    assert_eq!(live.len(), 1);
    assert_eq!((live[0].start, live[0].profile.as_str(), live[0].state.as_str()), (6, "1g.10gb", "active"));

    // The upgraded database takes new writes in today's convention beside the old rows.
    let t2 = store
        .create_tenant(
            "nlp",
            tessera_core::quota::ApprovalPolicy { auto_approve: false, auto_approve_max_compute_slices: 0 },
            "test",
        )
        .await
        .expect("a new tenant");
    assert_eq!(store.tenant(&t2.id).await.expect("read back").created_at_ms, t2.created_at_ms);
    assert_eq!(store.tenants().await.expect("tenants").len(), 2);
}

#[tokio::test]
async fn a_postgres_database_from_the_release_before_keeps_its_times_and_numbers() {
    let Some(db) = ScratchDb::create("the PostgreSQL upgrade test").await else { return };
    let old = migrations_up_to("postgres", 13);
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    Migrator::new(old.as_path()).await.expect("old migrations").run(&pool).await.expect("old schema");
    for sql in OLD_POSTGRES_ROWS {
        sqlx::query(sql).execute(&pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    pool.close().await;

    let store = Store::connect(&db.url).await.expect("store");
    store.migrate().await.expect("upgrade");
    assert_carried_over(&store).await;
    store.close().await;
    db.drop().await;
    let _ = std::fs::remove_dir_all(old);
}

#[tokio::test]
async fn a_sqlite_database_from_the_release_before_keeps_its_times_and_numbers() {
    let file = std::env::temp_dir().join(format!("tessera-upgrade-{}.db", uuid::Uuid::now_v7().simple()));
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let old = migrations_up_to("sqlite", 12);
    let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
    Migrator::new(old.as_path()).await.expect("old migrations").run(&pool).await.expect("old schema");
    for sql in OLD_SQLITE_ROWS {
        sqlx::query(sql).execute(&pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    pool.close().await;

    let store = Store::connect(&url).await.expect("store");
    store.migrate().await.expect("upgrade");
    assert_carried_over(&store).await;
    store.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    let _ = std::fs::remove_dir_all(old);
}

/// Telemetry minutes stored before the rollups existed: the upgrade makes the 10-minute and hour series of them
/// (sample-weighted), and the minutes read as before (PostgreSQL keeps only the last 48 hours of them, in its
/// partitioned table; what is older lives on in the rollups; SQLite's are deleted by the first retention pass).
async fn minutes_before_rollups(url: &str, backend: &str, last: u32) {
    use tessera_core::rollup::Tier;
    let now = tessera_server::store::now_ms();
    let recent = (now - 3_600_000) / 3_600_000 * 3_600_000;
    let old_day = recent - 3 * 86_400_000;
    let old = migrations_up_to(backend, last);
    let rows: Vec<String> = [recent, recent + 60_000, old_day, old_day + 60_000]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "INSERT INTO telemetry_minutes (device, minute_ms, node_id, gpu, profile, start, samples, util_avg, \
                 util_max, mem_used_avg, mem_total, power_avg, temp_max, mem_used_max) VALUES ('GPU-1', {t}, 'n1', \
                 'GPU-1', NULL, NULL, {}, {}, 90, 100, 1000, NULL, 50, 200)",
                20 + 40 * (i % 2),
                10 + 30 * (i % 2)
            )
        })
        .collect();
    macro_rules! old_schema {
        ($pool:expr) => {{
            let pool = $pool;
            Migrator::new(old.as_path()).await.expect("old migrations").run(&pool).await.expect("old schema");
            for sql in &rows {
                sqlx::query(sql).execute(&pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            pool.close().await;
        }};
    }
    if backend == "sqlite" {
        old_schema!(sqlx::SqlitePool::connect(url).await.expect("connect"));
    } else {
        old_schema!(sqlx::PgPool::connect(url).await.expect("connect"));
    }
    let store = Store::connect(url).await.expect("store");
    store.migrate().await.expect("upgrade");
    // Each pair of minutes is one 10-minute and one hour row: (20 × 10 + 60 × 40) / 80 = 32.5.
    for tier in [Tier::TenMinutes, Tier::Hour] {
        let rows = store.series(tier, None, 0, i64::MAX).await.expect("series");
        assert_eq!(rows.len(), 2, "{backend} {tier:?}: {rows:?}");
        for r in &rows {
            assert_eq!((r.samples, r.util_avg, r.util_max, r.mem_used_max), (80, 32.5, 90.0, Some(200.0)));
        }
        assert_eq!(store.device_use(tier, "GPU-1", 0, i64::MAX).await.expect("use").minutes, 4);
    }
    let minutes = store.minutes(None, 0, i64::MAX).await.expect("minutes");
    let kept = if backend == "sqlite" { 4 } else { 2 };
    assert_eq!(minutes.len(), kept, "{backend}: {minutes:?}");
    store.keep_telemetry(now).await.expect("keep");
    assert_eq!(store.minutes(None, 0, i64::MAX).await.expect("minutes").len(), 2);
    // New minutes merge into the rolled-up rows.
    let more = tessera_server::store::telemetry::MinuteRow { minute_ms: recent + 120_000, ..minutes[0].clone() };
    store.write_minutes(&[more]).await.expect("write");
    assert_eq!(store.series(Tier::Hour, None, recent, recent + 1).await.expect("series")[0].samples, 100);
    store.close().await;
    let _ = std::fs::remove_dir_all(old);
}

#[tokio::test]
async fn telemetry_minutes_stored_before_the_rollups_are_rolled_up_on_postgres() {
    let Some(db) = ScratchDb::create("the PostgreSQL telemetry upgrade test").await else { return };
    minutes_before_rollups(&db.url, "postgres", 30).await;
    db.drop().await;
}

#[tokio::test]
async fn telemetry_minutes_stored_before_the_rollups_are_rolled_up_on_sqlite() {
    let file = std::env::temp_dir().join(format!("tessera-upgrade-{}.db", uuid::Uuid::now_v7().simple()));
    minutes_before_rollups(&format!("sqlite://{}?mode=rwc", file.display()), "sqlite", 28).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// One column as a schema has it: `(table or view, column) -> (declared type, NOT NULL, default)`.
type Columns = std::collections::BTreeMap<(String, String), (String, bool, Option<String>)>;

/// The backend's migration files in order: `(number, file name, SQL)`.
fn migration_files(backend: &str) -> Vec<(u32, String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations").join(backend);
    let mut files: Vec<(u32, String, String)> = std::fs::read_dir(&dir)
        .expect("migrations")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .map(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            let number = name.split('_').next().and_then(|n| n.parse().ok()).expect("a numbered migration");
            (number, name, std::fs::read_to_string(&p).expect("read"))
        })
        .collect();
    files.sort();
    files
}

/// Migrations that break the policy, as `(backend, number)`, each for its reason. A new entry needs one as good:
/// an older release must keep working on the schema a newer one made.
/// - PostgreSQL 14: shipped before the policy, while no two releases ran side by side (every time column from
///   `timestamptz` to milliseconds, 25 columns).
/// - PostgreSQL 36: on purpose. An older replica keeping an allocation's hour beside an upgraded one must fail its
///   insert (the upgraded replica keeps that hour) rather than write running sums of 0, which every later report
///   would read.
const BREAKS_ALLOWED: &[(&str, u32)] = &[("postgres", 14), ("postgres", 36)];

/// What the release before reads and writes that `after` no longer allows: a table, view or column dropped or
/// renamed, a column's type changed or made NOT NULL, a NOT NULL column without a default added to a table it
/// writes.
fn breaks(before: &Columns, after: &Columns) -> Vec<String> {
    let mut found = Vec::new();
    for ((table, column), (kind, not_null, _)) in before {
        match after.get(&(table.clone(), column.clone())) {
            None => found.push(format!("{table}.{column} dropped or renamed")),
            Some((k, _, _)) if !k.eq_ignore_ascii_case(kind) => {
                found.push(format!("{table}.{column} changed from {kind} to {k}"))
            }
            Some((_, true, None)) if !not_null => found.push(format!("{table}.{column} made NOT NULL")),
            Some(_) => {}
        }
    }
    let tables: std::collections::BTreeSet<&String> = before.keys().map(|(t, _)| t).collect();
    for ((table, column), (_, not_null, default)) in after {
        let new = !before.contains_key(&(table.clone(), column.clone()));
        if new && tables.contains(table) && *not_null && default.is_none() {
            found.push(format!("{table}.{column} added NOT NULL without a default"));
        }
    }
    found
}

async fn sqlite_columns(pool: &sqlx::SqlitePool) -> Columns {
    let rows: Vec<(String, String, String, bool, Option<String>)> = sqlx::query_as(
        "SELECT m.name, p.name, p.type, p.\"notnull\", p.dflt_value FROM sqlite_master m, pragma_table_info(m.name) p \
         WHERE m.type IN ('table', 'view') AND m.name NOT LIKE 'sqlite_%' AND m.name NOT LIKE '_sqlx%'",
    )
    .fetch_all(pool)
    .await
    .expect("schema");
    rows.into_iter().map(|(t, c, k, n, d)| ((t, c), (k, n, d))).collect()
}

async fn postgres_columns(pool: &sqlx::PgPool) -> Columns {
    let rows: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text, column_default::text \
         FROM information_schema.columns WHERE table_schema = current_schema() AND table_name NOT LIKE '_sqlx%'",
    )
    .fetch_all(pool)
    .await
    .expect("schema");
    rows.into_iter().map(|(t, c, k, n, d)| ((t, c), (k, n == "NO", d))).collect()
}

/// Every migration but [`BREAKS_ALLOWED`] leaves what the release before it reads and writes in place (see
/// docs/operations.md, Upgrades), checked on the schema itself after each migration, on both backends.
#[tokio::test]
async fn every_migration_keeps_what_the_release_before_reads_and_writes() {
    let mut found = Vec::new();
    let file = std::env::temp_dir().join(format!("tessera-policy-{}.db", uuid::Uuid::now_v7().simple()));
    let sqlite = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", file.display())).await.expect("sqlite");
    let mut before = Columns::new();
    for (number, name, sql) in migration_files("sqlite") {
        sqlx::raw_sql(&sql).execute(&sqlite).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = sqlite_columns(&sqlite).await;
        if !BREAKS_ALLOWED.contains(&("sqlite", number)) {
            found.extend(breaks(&before, &after).into_iter().map(|b| format!("sqlite {name}: {b}")));
        }
        before = after;
    }
    sqlite.close().await;
    let _ = std::fs::remove_file(&file);
    if let Some(db) = ScratchDb::create("the PostgreSQL half of the upgrade policy").await {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        let mut before = Columns::new();
        for (number, name, sql) in migration_files("postgres") {
            sqlx::raw_sql(&sql).execute(&pool).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            let after = postgres_columns(&pool).await;
            if !BREAKS_ALLOWED.contains(&("postgres", number)) {
                found.extend(breaks(&before, &after).into_iter().map(|b| format!("postgres {name}: {b}")));
            }
            before = after;
        }
        pool.close().await;
        db.drop().await;
    }
    assert!(found.is_empty(), "migrations that break the release before (expand, migrate, contract):\n{found:#?}");
}

#[test]
fn the_policy_check_finds_each_kind_of_break() {
    let col = |t: &str, c: &str, k: &str, n: bool, d: Option<&str>| {
        ((t.to_string(), c.to_string()), (k.to_string(), n, d.map(str::to_string)))
    };
    let before: Columns = [col("t", "a", "TEXT", false, None), col("t", "b", "INTEGER", true, None)].into();
    let same = breaks(&before, &before);
    assert!(same.is_empty(), "{same:?}");
    let expanded: Columns = [
        col("t", "a", "text", false, None),
        col("t", "b", "INTEGER", true, None),
        col("t", "c", "INTEGER", true, Some("0")),
        col("t", "d", "TEXT", false, None),
        col("u", "x", "TEXT", true, None),
    ]
    .into();
    assert!(breaks(&before, &expanded).is_empty(), "nullable or defaulted columns and new tables are fine");
    let broken: Columns = [col("t", "a", "INTEGER", true, None), col("t", "c", "INTEGER", true, None)].into();
    assert_eq!(
        breaks(&before, &broken),
        ["t.a changed from TEXT to INTEGER", "t.b dropped or renamed", "t.c added NOT NULL without a default"]
    );
    let tightened: Columns = [col("t", "a", "TEXT", true, None), col("t", "b", "INTEGER", true, None)].into();
    assert_eq!(breaks(&before, &tightened), ["t.a made NOT NULL"]);
}
