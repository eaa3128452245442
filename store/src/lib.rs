//! Persistence: one store surface with a SQLite implementation (the embedded default) and a PostgreSQL one
//! (production), chosen once from the database URL.
//!
//! Rules that need no I/O come from `tessera-core` (quota check, request transitions); the store's job is to run
//! them inside the right transaction. Creating a request checks the tenant's quota and inserts the request in one
//! transaction that serialises with every other writer for that tenant: SQLite takes the database write lock up
//! front (`BEGIN IMMEDIATE`), PostgreSQL locks the tenant's row (`SELECT ... FOR UPDATE`). So concurrent clients can
//! never together overshoot a limit. State changes use an optimistic version check, so of two admins acting on the
//! same request one wins and the other gets [`StoreError::Conflict`]. Every change writes an audit entry in the same
//! transaction.

#[macro_use]
mod dialect;

pub mod agents;
pub mod allocation_hours;
pub mod attribution;
pub mod audit;
pub mod auth;
pub mod backup;
pub mod batch;
pub mod changes;
pub mod clusters;
pub mod cohorts;
pub mod controller;
pub mod efficiency;
pub mod fleet;
pub mod governance;
pub mod heatmap;
pub mod history;
mod json_rows;
mod layouts;
pub mod notifications;
pub mod people;
mod postgres;
pub mod quotas;
mod requests;
pub mod reservations;
mod sqlite;
pub mod telemetry;
pub mod turns;
mod views;
mod windows;
mod writes;

mod records;

pub use batch::Created;
pub use layouts::ProposalNeed;
pub use records::*;
use serde::Serialize;
pub use tessera_api::Role;
use tessera_core::layout::PlacedInstance;
use tessera_core::quota::{ApprovalPolicy, QuotaError, Usage};
use tessera_core::request::{RequestState, SliceSpec, TransitionError};

/// Store failures, mapped once to HTTP by the API layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object does not exist (or is not visible).
    #[error("{what} not found")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// A uniqueness rule or a version check failed.
    #[error("conflict on {constraint}")]
    Conflict {
        /// The constraint or `version`.
        constraint: String,
    },
    /// The request does not fit the tenant's quota.
    #[error("quota exceeded: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Quota(Vec<QuotaError>),
    /// The request's life does not allow the change.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// A quota request (or its grant) that the rules refuse.
    #[error(transparent)]
    QuotaAsk(tessera_core::quota_request::AskError),
    /// A quota request whose state does not allow the change.
    #[error("a quota request that is {from} cannot become {to}")]
    QuotaState {
        /// Its state.
        from: tessera_core::quota_request::QuotaRequestState,
        /// The state asked for.
        to: tessera_core::quota_request::QuotaRequestState,
    },
    /// The database URL is not one Tessera can use (only its scheme is kept: the rest may hold a password).
    #[error("unsupported database URL scheme `{0}`: use sqlite://PATH or postgres://...")]
    BadUrl(String),
    /// Anything else from the database.
    #[error("database error: {0}")]
    Other(#[from] sqlx::Error),
    /// Stored data that does not parse.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// A change the rules refuse, with a stable code.
    #[error("{detail}")]
    Rule {
        /// Stable machine-readable code.
        code: &'static str,
        /// What is wrong and what to do.
        detail: String,
    },
    /// A change that conflicts with what exists, with a stable code (deleting what others still use).
    #[error("{detail}")]
    InUse {
        /// Stable machine-readable code.
        code: &'static str,
        /// What still uses it and what to do.
        detail: String,
    },
    /// A database error, as text (one error shared by every request of a failed batch).
    #[error("database error: {0}")]
    Failed(String),
}

/// The store, on one backend, with a counter of committed changes to slice requests (see [`Store::generation`]):
/// every method that writes `slice_requests` bumps it.
#[derive(Debug, Clone)]
pub struct Store {
    db: Db,
    changes: std::sync::Arc<changes::Changes>,
    /// The fleet as last read, under the `fleet_version` it was read at (see [`Store::nodes`]).
    fleet: fleet::FleetCache,
    /// Whose write goes first on SQLite (see [`turns`]).
    turns: std::sync::Arc<turns::Turns>,
}

/// The database behind a [`Store`].
#[derive(Debug, Clone)]
enum Db {
    /// Embedded SQLite (WAL, foreign keys, busy timeout).
    Sqlite(sqlx::SqlitePool),
    /// PostgreSQL.
    Postgres(sqlx::PgPool),
}

/// Current UTC time in milliseconds.
pub use tessera_core::clock::now_ms;

/// A new UUIDv7, as text.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A new id for a record made at `at_ms` (UTC milliseconds; a past one for recorded history), so that ids sort as
/// the records' times do.
pub(crate) fn new_id_at(at_ms: i64) -> String {
    let ms = u64::try_from(at_ms).unwrap_or(0);
    let at = uuid::Timestamp::from_unix(uuid::NoContext, ms / 1000, ((ms % 1000) * 1_000_000) as u32);
    uuid::Uuid::new_v7(at).to_string()
}

/// Parses stored quota rows `(resource, milli)`.
pub(crate) fn usage_from_rows(rows: Vec<(String, i64)>) -> Result<Usage, StoreError> {
    let catalog = tessera_core::Catalog::builtin();
    rows.into_iter()
        .map(|(r, m)| {
            let resource =
                tessera_core::quota::Resource::parse(catalog, &r).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            Ok((resource, u64::try_from(m).unwrap_or(0)))
        })
        .collect()
}

/// A GPU row (the columns of `fleet::GPU_FIELDS`, or on SQLite an array of `fleet::GPU_JSON`).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct GpuRow {
    id: String,
    node_id: String,
    idx: i64,
    uuid: String,
    model: String,
    #[serde(deserialize_with = "json_rows::flag")]
    mig_enabled: bool,
    #[serde(deserialize_with = "json_rows::flag")]
    cordoned: bool,
    /// The layout, as JSON.
    layout: String,
    layout_version: i64,
    #[serde(deserialize_with = "json_rows::flag")]
    auto_layout: bool,
    health: String,
    /// The findings, as JSON.
    health_findings: String,
    health_since_ms: Option<i64>,
}

pub(crate) fn gpu_from(row: GpuRow) -> Result<Gpu, StoreError> {
    let GpuRow {
        id,
        node_id,
        idx,
        uuid,
        model,
        mig_enabled,
        cordoned,
        layout,
        layout_version,
        auto_layout,
        health,
        health_findings,
        health_since_ms,
    } = row;
    let health = GpuHealth {
        state: tessera_core::health::HealthState::parse(&health)
            .ok_or_else(|| StoreError::Corrupt(format!("gpu health {health}")))?,
        findings: serde_json::from_str(&health_findings)
            .map_err(|e| StoreError::Corrupt(format!("gpu health: {e}")))?,
        since_ms: health_since_ms,
    };
    Ok(Gpu {
        id,
        node_id,
        index: u32::try_from(idx).map_err(|_| StoreError::Corrupt(format!("gpu index {idx}")))?,
        uuid,
        model,
        mig_enabled,
        cordoned,
        layout: layout_from(&layout)?,
        layout_version,
        auto_layout,
        health,
    })
}

pub(crate) fn layout_from(text: &str) -> Result<Vec<PlacedInstance>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("layout: {e}")))
}

/// A layout proposal row (the columns of `layouts::PROPOSAL_COLUMNS`); the layouts are JSON.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ProposalRow {
    id: String,
    gpu_id: String,
    base_version: i64,
    layout: String,
    created: String,
    destroyed: String,
    state: String,
    reason: String,
    created_by: String,
    decided_by: Option<String>,
    created_at_ms: i64,
    decided_at_ms: Option<i64>,
}

pub(crate) fn proposal_from(row: ProposalRow) -> Result<LayoutProposal, StoreError> {
    Ok(LayoutProposal {
        layout: layout_from(&row.layout)?,
        created: layout_from(&row.created)?,
        destroyed: layout_from(&row.destroyed)?,
        id: row.id,
        gpu_id: row.gpu_id,
        base_version: row.base_version,
        state: row.state,
        reason: row.reason,
        created_by: row.created_by,
        decided_by: row.decided_by,
        created_at_ms: row.created_at_ms,
        decided_at_ms: row.decided_at_ms,
    })
}

/// An allocation row (the columns of `layouts::ALLOCATION_FIELDS`, or on SQLite an array of
/// `layouts::ALLOCATION_JSON`).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct AllocationRow {
    id: String,
    request_id: String,
    tenant_id: String,
    gpu_id: String,
    profile: String,
    start: i64,
    state: String,
    proposal_id: Option<String>,
}

pub(crate) fn allocation_from(row: AllocationRow) -> Allocation {
    let AllocationRow { id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id } = row;
    Allocation {
        id,
        request_id,
        tenant_id,
        gpu_id,
        profile,
        start: u8::try_from(start).unwrap_or(u8::MAX),
        state,
        proposal_id,
    }
}

/// A node row, without its GPUs (or on SQLite an array of its three columns).
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct NodeRow {
    id: String,
    name: String,
    created_at_ms: i64,
}

/// Groups GPUs under their nodes (by node id first, so that the cost grows with the GPUs, not nodes × GPUs).
pub(crate) fn nodes_from(nodes: Vec<NodeRow>, gpus: Vec<Gpu>) -> Vec<Node> {
    let mut by_node: std::collections::HashMap<String, Vec<Gpu>> = std::collections::HashMap::new();
    for g in gpus {
        by_node.entry(g.node_id.clone()).or_default().push(g);
    }
    nodes
        .into_iter()
        .map(|NodeRow { id, name, created_at_ms }| {
            let mut mine = by_node.remove(&id).unwrap_or_default();
            mine.sort_by_key(|g| g.index);
            Node { id, name, created_at_ms, gpus: mine }
        })
        .collect()
}

/// An audit row; the states before and after are JSON.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AuditRow {
    at_ms: i64,
    actor: String,
    action: String,
    object: String,
    before_json: Option<String>,
    after_json: Option<String>,
}

pub(crate) fn audit_from(row: AuditRow) -> AuditEntry {
    let AuditRow { at_ms, actor, action, object, before_json, after_json } = row;
    AuditEntry { at_ms, actor, action, object, before: before_json, after: after_json }
}

/// A tenant row (the columns of `requests::TENANT_COLUMNS`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TenantRow {
    id: String,
    name: String,
    auto_approve: bool,
    auto_approve_max_compute_slices: i64,
    created_at_ms: i64,
    cohort_id: Option<String>,
    weight: i64,
}

pub(crate) fn tenant_from(row: TenantRow) -> Tenant {
    let TenantRow { id, name, auto_approve, auto_approve_max_compute_slices: max, created_at_ms, cohort_id, weight } =
        row;
    let policy = ApprovalPolicy { auto_approve, auto_approve_max_compute_slices: u32::try_from(max).unwrap_or(0) };
    Tenant { id, name, policy, created_at_ms, cohort_id, weight: u32::try_from(weight).unwrap_or(1).max(1) }
}

/// A user row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct UserRow {
    id: String,
    name: String,
    platform_admin: bool,
    created_at_ms: i64,
}

pub(crate) fn user_from(row: UserRow) -> User {
    let UserRow { id, name, platform_admin, created_at_ms } = row;
    User { id, name, platform_admin, created_at_ms }
}

pub(crate) fn state_from(text: &str) -> Result<RequestState, StoreError> {
    text.parse().map_err(StoreError::Corrupt)
}

pub(crate) fn spec_from(text: &str) -> Result<SliceSpec, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("request spec: {e}")))
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

impl Store {
    /// Connects to `url`: `sqlite://PATH` (created if missing) or `postgres://...`.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        if url.starts_with("sqlite:") {
            let db = Db::Sqlite(sqlite::connect(url).await?);
            Ok(Store {
                db,
                changes: std::sync::Arc::new(changes::Changes::local()),
                fleet: Default::default(),
                turns: Default::default(),
            })
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let pool = postgres::connect(url).await?;
            let changes = std::sync::Arc::new(changes::Changes::shared());
            tokio::spawn(changes::follow(pool.clone(), std::sync::Arc::downgrade(&changes)));
            Ok(Store { db: Db::Postgres(pool), changes, fleet: Default::default(), turns: Default::default() })
        } else {
            Err(StoreError::BadUrl(url.split(':').next().unwrap_or_default().chars().take(32).collect()))
        }
    }

    /// Closes the connections (and stops following other writers' changes).
    pub async fn close(&self) {
        match &self.db {
            Db::Sqlite(p) => p.close().await,
            Db::Postgres(p) => p.close().await,
        }
    }

    /// The generation of the data, for caches of what was read (see [`changes`]): take it before reading, file
    /// what was read under it, and serve it only while this still returns the same value. `None`: do not cache.
    pub fn generation(&self) -> Option<u64> {
        self.changes.current()
    }

    /// Counts a change when dropped: write methods hold one across their transaction, so the count moves after
    /// the commit, and also when the caller stops waiting half-way (the commit may still have happened).
    fn changing(&self) -> changes::Changing<'_> {
        changes::Changing(&self.changes)
    }

    /// Applies the backend's migrations (`migrations/sqlite` or `migrations/postgres`).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::MIGRATOR.run(p).await.map_err(|e| StoreError::Other(e.into())),
            Db::Postgres(p) => postgres::MIGRATOR.run(p).await.map_err(|e| StoreError::Other(e.into())),
        }
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlx::query("SELECT 1").execute(p).await.map(|_| ()),
            Db::Postgres(p) => sqlx::query("SELECT 1").execute(p).await.map(|_| ()),
        }
        .map_err(StoreError::Other)
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match &self.db {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }
}

/// Maps a unique-constraint violation to [`StoreError::Conflict`], anything else to [`StoreError::Other`].
pub(crate) fn on_constraint(e: sqlx::Error, constraint: &str) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict { constraint: constraint.to_string() }
        }
        sqlx::Error::Database(db) if db.is_foreign_key_violation() => {
            StoreError::NotFound { what: "tenant".to_string() }
        }
        _ => StoreError::Other(e),
    }
}
