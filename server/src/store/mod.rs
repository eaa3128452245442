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

/// Runs `$body` with `$pool` bound to the store's pool, `$dialect` to its [`Dialect`] and `$audit` to its
/// audit-insert function.
macro_rules! on_pool {
    ($store:expr, $pool:ident, $dialect:ident, $audit:ident => $body:expr) => {
        match &$store.db {
            Db::Sqlite($pool) => {
                let $dialect = Dialect::Sqlite;
                #[allow(unused_variables)]
                let $audit = super::sqlite::audit_insert;
                $body
            }
            Db::Postgres($pool) => {
                let $dialect = Dialect::Postgres;
                #[allow(unused_variables)]
                let $audit = super::postgres::audit_insert;
                $body
            }
        }
    };
}

pub mod agents;
pub mod audit;
pub mod auth;
pub mod batch;
pub mod changes;
pub mod people;
mod postgres;
mod sqlite;
pub mod telemetry;

mod records;

pub use batch::Created;
pub use records::*;
use serde::Serialize;
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
    /// The database URL is not one Tessera can use (only its scheme is kept: the rest may hold a password).
    #[error("unsupported database URL scheme `{0}`: use sqlite://PATH or postgres://...")]
    BadUrl(String),
    /// Anything else from the database.
    #[error("database error: {0}")]
    Other(#[from] sqlx::Error),
    /// Stored data that does not parse.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
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
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A new UUIDv7, as text.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
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

/// A GPU row: `(id, node_id, idx, uuid, model, mig_enabled, cordoned, layout_json, layout_version, auto_layout)`.
pub(crate) type GpuRow = (String, String, i64, String, String, bool, bool, String, i64, bool);

pub(crate) fn gpu_from(row: GpuRow) -> Result<Gpu, StoreError> {
    let (id, node_id, index, uuid, model, mig_enabled, cordoned, layout, layout_version, auto_layout) = row;
    Ok(Gpu {
        id,
        node_id,
        index: u32::try_from(index).map_err(|_| StoreError::Corrupt(format!("gpu index {index}")))?,
        uuid,
        model,
        mig_enabled,
        cordoned,
        layout: layout_from(&layout)?,
        layout_version,
        auto_layout,
    })
}

pub(crate) fn layout_from(text: &str) -> Result<Vec<PlacedInstance>, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("layout: {e}")))
}

/// A proposal row: `(id, gpu_id, base_version, layout, created, destroyed, state, reason, created_by, decided_by,
/// created_at_ms, decided_at_ms)`.
pub(crate) type ProposalRow =
    (String, String, i64, String, String, String, String, String, String, Option<String>, i64, Option<i64>);

pub(crate) fn proposal_from(row: ProposalRow) -> Result<LayoutProposal, StoreError> {
    let (
        id,
        gpu_id,
        base_version,
        layout,
        created,
        destroyed,
        state,
        reason,
        created_by,
        decided_by,
        created_at_ms,
        decided_at_ms,
    ) = row;
    Ok(LayoutProposal {
        id,
        gpu_id,
        base_version,
        layout: layout_from(&layout)?,
        created: layout_from(&created)?,
        destroyed: layout_from(&destroyed)?,
        state,
        reason,
        created_by,
        decided_by,
        created_at_ms,
        decided_at_ms,
    })
}

/// An allocation row: `(id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id)`.
pub(crate) type AllocationRow = (String, String, String, String, String, i64, String, Option<String>);

pub(crate) fn allocation_from(row: AllocationRow) -> Allocation {
    let (id, request_id, tenant_id, gpu_id, profile, start, state, proposal_id) = row;
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

/// Groups GPUs under their nodes.
pub(crate) fn nodes_from(nodes: Vec<(String, String, i64)>, gpus: Vec<Gpu>) -> Vec<Node> {
    nodes
        .into_iter()
        .map(|(id, name, created_at_ms)| {
            let mut mine: Vec<Gpu> = gpus.iter().filter(|g| g.node_id == id).cloned().collect();
            mine.sort_by_key(|g| g.index);
            Node { id, name, created_at_ms, gpus: mine }
        })
        .collect()
}

/// An audit row: `(at_ms, actor, action, object, before_json, after_json)`.
pub(crate) type AuditRow = (i64, String, String, String, Option<String>, Option<String>);

pub(crate) fn audit_from((at_ms, actor, action, object, before, after): AuditRow) -> AuditEntry {
    AuditEntry { at_ms, actor, action, object, before, after }
}

/// A tenant row: `(id, name, auto_approve, auto_approve_max_compute_slices, created_at_ms)`.
pub(crate) type TenantRow = (String, String, bool, i64, i64);

pub(crate) fn tenant_from((id, name, auto_approve, max, created_at_ms): TenantRow) -> Tenant {
    let policy = ApprovalPolicy { auto_approve, auto_approve_max_compute_slices: u32::try_from(max).unwrap_or(0) };
    Tenant { id, name, policy, created_at_ms }
}

/// A user row: `(id, name, platform_admin, created_at_ms)`.
pub(crate) type UserRow = (String, String, bool, i64);

pub(crate) fn user_from((id, name, platform_admin, created_at_ms): UserRow) -> User {
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
            Ok(Store { db, changes: std::sync::Arc::new(changes::Changes::local()) })
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let pool = postgres::connect(url).await?;
            let changes = std::sync::Arc::new(changes::Changes::shared());
            tokio::spawn(changes::follow(pool.clone(), std::sync::Arc::downgrade(&changes)));
            Ok(Store { db: Db::Postgres(pool), changes })
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

    /// Creates a tenant; a taken name is a conflict on `tenants.name`.
    pub async fn create_tenant(&self, name: &str, policy: ApprovalPolicy, actor: &str) -> Result<Tenant, StoreError> {
        let tenant = Tenant { id: new_id(), name: name.to_string(), policy, created_at_ms: now_ms() };
        match &self.db {
            Db::Sqlite(p) => sqlite::create_tenant(p, &tenant, actor).await?,
            Db::Postgres(p) => postgres::create_tenant(p, &tenant, actor).await?,
        }
        Ok(tenant)
    }

    /// Every tenant, by name.
    pub async fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::tenants(p).await,
            Db::Postgres(p) => postgres::tenants(p).await,
        }
    }

    /// A tenant by id.
    pub async fn tenant(&self, id: &str) -> Result<Tenant, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::tenant(p, id).await,
            Db::Postgres(p) => postgres::tenant(p, id).await,
        }
    }

    /// Sets (or replaces) a tenant's limit on one resource, in thousandths.
    pub async fn set_quota(
        &self,
        tenant_id: &str,
        resource: &tessera_core::quota::Resource,
        limit_milli: u64,
        actor: &str,
    ) -> Result<(), StoreError> {
        self.set_quotas(tenant_id, &[(resource.clone(), Some(limit_milli))], actor).await
    }

    /// Sets several limits in one transaction: all of them or none. `None` removes a limit (the resource is then
    /// unlimited); each change is audited with the limit before it.
    pub async fn set_quotas(
        &self,
        tenant_id: &str,
        limits: &[(tessera_core::quota::Resource, Option<u64>)],
        actor: &str,
    ) -> Result<(), StoreError> {
        let rows: Vec<(String, Option<i64>)> =
            limits.iter().map(|(r, m)| (r.to_string(), m.map(|m| i64::try_from(m).unwrap_or(i64::MAX)))).collect();
        match &self.db {
            Db::Sqlite(p) => sqlite::set_quotas(p, tenant_id, &rows, actor).await,
            Db::Postgres(p) => postgres::set_quotas(p, tenant_id, &rows, actor).await,
        }
    }

    /// A tenant's limits.
    pub async fn quotas(&self, tenant_id: &str) -> Result<Usage, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::quotas(p, tenant_id).await,
            Db::Postgres(p) => postgres::quotas(p, tenant_id).await,
        }
    }

    /// What a tenant's live requests (pending, approved, provisioning, active) hold.
    pub async fn held(&self, tenant_id: &str) -> Result<Usage, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::held(p, tenant_id).await,
            Db::Postgres(p) => postgres::held(p, tenant_id).await,
        }
    }

    /// Creates a request if it fits the tenant's quota, atomically with respect to every other request of the
    /// tenant. Fails with [`StoreError::Quota`] listing every limit it would exceed. With an idempotency key already
    /// used by the same user, returns the request it created and `false`.
    pub async fn create_request(&self, new: NewRequest<'_>) -> Result<(SliceRequest, bool), StoreError> {
        let request = new.to_request(now_ms());
        let _changing = self.changing();
        let replayed = match &self.db {
            Db::Sqlite(p) => sqlite::create_request(p, &request, new.charge, new.actor, new.idempotency).await,
            Db::Postgres(p) => postgres::create_request(p, &request, new.charge, new.actor, new.idempotency).await,
        }?;
        match replayed {
            Some(first) => Ok((first, false)),
            None => Ok((request, true)),
        }
    }

    /// Creates many requests in one transaction (group commit): each is decided in order exactly as
    /// [`Store::create_request`] would decide it, and gets its own outcome. More than [`batch::MAX_BATCH`] go in
    /// several transactions. Where a batch fails as a whole because of another writer (a concurrent writer took
    /// one of its idempotency keys, a deadlock or serialization failure), its requests are created one at a time
    /// instead, so one request never fails another; any other failure (the database is unreachable, the commit
    /// was lost) is every request's outcome, never retried, because the commit may have happened.
    pub async fn create_requests(&self, batch: &[NewRequest<'_>]) -> Vec<Result<Created, StoreError>> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(batch::MAX_BATCH) {
            outcomes.extend(self.create_batch(chunk).await);
        }
        outcomes
    }

    async fn create_batch(&self, batch: &[NewRequest<'_>]) -> Vec<Result<Created, StoreError>> {
        let now = now_ms();
        let items: Vec<(SliceRequest, NewRequest<'_>)> = batch.iter().map(|n| (n.to_request(now), *n)).collect();
        let done = {
            let _changing = self.changing();
            match &self.db {
                Db::Sqlite(p) => sqlite::batch::create_requests(p, &items).await,
                Db::Postgres(p) => postgres::batch::create_requests(p, &items).await,
            }
        };
        match done {
            Ok(outcomes) => outcomes,
            Err(e) if batch.len() == 1 => vec![Err(e)],
            Err(e) if batch::lost_to_another_writer(&e) => {
                tracing::debug!(error = %e, size = batch.len(), "batch lost to another writer; creating one at a time");
                let mut outcomes = Vec::with_capacity(batch.len());
                for new in batch {
                    outcomes.push(self.create_one(*new).await);
                }
                outcomes
            }
            Err(e) => {
                let failed = e.to_string();
                let mut outcomes = vec![Err(e)];
                outcomes.extend((1..batch.len()).map(|_| Err(StoreError::Failed(failed.clone()))));
                outcomes
            }
        }
    }

    async fn create_one(&self, new: NewRequest<'_>) -> Result<Created, StoreError> {
        let (request, created) = self.create_request(new).await?;
        let tenant = self.tenant(new.tenant_id).await?;
        Ok(Created { request, created, tenant })
    }

    /// Creates a user.
    pub async fn create_user(&self, name: &str, platform_admin: bool, actor: &str) -> Result<User, StoreError> {
        let user = User { id: new_id(), name: name.to_string(), platform_admin, created_at_ms: now_ms() };
        match &self.db {
            Db::Sqlite(p) => sqlite::create_user(p, &user, actor).await?,
            Db::Postgres(p) => postgres::create_user(p, &user, actor).await?,
        }
        Ok(user)
    }

    /// A user by name.
    pub async fn user_by_name(&self, name: &str) -> Result<User, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::user_by_name(p, name).await,
            Db::Postgres(p) => postgres::user_by_name(p, name).await,
        }
    }

    /// Adds (or changes) a user's membership of a tenant.
    pub async fn set_membership(
        &self,
        user_id: &str,
        tenant_id: &str,
        role: Role,
        actor: &str,
    ) -> Result<(), StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::set_membership(p, user_id, tenant_id, role, actor).await,
            Db::Postgres(p) => postgres::set_membership(p, user_id, tenant_id, role, actor).await,
        }
    }

    /// A tenant's members `(user, role)`, by name.
    pub async fn members(&self, tenant_id: &str) -> Result<Vec<(User, Role)>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::members(p, tenant_id).await,
            Db::Postgres(p) => postgres::members(p, tenant_id).await,
        }
    }

    /// Stores an API token for a user: only the SHA-256 of its secret.
    pub async fn create_token(
        &self,
        user_id: &str,
        name: &str,
        secret_sha256: &str,
        actor: &str,
    ) -> Result<String, StoreError> {
        let id = new_id();
        match &self.db {
            Db::Sqlite(p) => sqlite::create_token(p, &id, user_id, name, secret_sha256, actor).await?,
            Db::Postgres(p) => postgres::create_token(p, &id, user_id, name, secret_sha256, actor).await?,
        }
        Ok(id)
    }

    /// Revokes a token. With `owner`, only that user's token matches (others get `NotFound`).
    pub async fn revoke_token(&self, id: &str, owner: Option<&str>, actor: &str) -> Result<(), StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::revoke_token(p, id, owner, actor).await,
            Db::Postgres(p) => postgres::revoke_token(p, id, owner, actor).await,
        }
    }

    /// The principal behind a token's secret hash, unless unknown or revoked.
    pub async fn principal_by_token(&self, secret_sha256: &str) -> Result<Option<Principal>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::principal_by_token(p, secret_sha256).await,
            Db::Postgres(p) => postgres::principal_by_token(p, secret_sha256).await,
        }
    }

    /// A request by id.
    pub async fn request(&self, id: &str) -> Result<SliceRequest, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::request(p, id).await,
            Db::Postgres(p) => postgres::request(p, id).await,
        }
    }

    /// Moves a request to another state if its life allows it and nobody changed it since `expected_version`.
    pub async fn transition(&self, t: Transition<'_>) -> Result<SliceRequest, StoreError> {
        let _changing = self.changing();
        match &self.db {
            Db::Sqlite(p) => sqlite::transition(p, t).await,
            Db::Postgres(p) => postgres::transition(p, t).await,
        }
    }

    /// Requests matching `filter`, by id (creation order).
    pub async fn list_requests(&self, filter: RequestFilter<'_>) -> Result<Vec<SliceRequest>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::list_requests(p, filter).await,
            Db::Postgres(p) => postgres::list_requests(p, filter).await,
        }
    }

    /// Registers a node with its GPUs, in one transaction. A taken node name or GPU UUID is a conflict.
    pub async fn register_node(&self, name: &str, gpus: &[NewGpu], actor: &str) -> Result<Node, StoreError> {
        let node_id = new_id();
        let node = Node {
            id: node_id.clone(),
            name: name.to_string(),
            created_at_ms: now_ms(),
            gpus: gpus
                .iter()
                .map(|g| Gpu {
                    id: new_id(),
                    node_id: node_id.clone(),
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    mig_enabled: g.mig_enabled,
                    cordoned: false,
                    layout: g.layout.clone(),
                    layout_version: 1,
                    auto_layout: false,
                })
                .collect(),
        };
        match &self.db {
            Db::Sqlite(p) => sqlite::fleet::register_node(p, &node, actor).await?,
            Db::Postgres(p) => postgres::fleet::register_node(p, &node, actor).await?,
        }
        Ok(node)
    }

    /// Every node with its GPUs, by name.
    pub async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::fleet::nodes(p).await,
            Db::Postgres(p) => postgres::fleet::nodes(p).await,
        }
    }

    /// Cordons or uncordons a GPU; returns it.
    pub async fn set_cordoned(&self, gpu_id: &str, cordoned: bool, actor: &str) -> Result<Gpu, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::fleet::set_flag(p, gpu_id, "cordoned", cordoned, actor).await,
            Db::Postgres(p) => postgres::fleet::set_flag(p, gpu_id, "cordoned", cordoned, actor).await,
        }
    }

    /// Approves a request with its placement, in one transaction: the request moves to approved (version
    /// checked), each layout change becomes a proposal (or is applied, on auto-layout GPUs, if the GPU's layout
    /// version is still the one planned on), and each slice reserves its exact instance. Fails with a conflict, and
    /// changes nothing, if the request, a GPU's layout, an open proposal or a reserved instance changed meanwhile.
    pub async fn approve_request(
        &self,
        t: Transition<'_>,
        changes: &[LayoutChange],
        reservations: &[Reservation],
    ) -> Result<(SliceRequest, Vec<LayoutProposal>), StoreError> {
        let _changing = self.changing();
        match &self.db {
            Db::Sqlite(p) => sqlite::layouts::approve_request(p, t, changes, reservations).await,
            Db::Postgres(p) => postgres::layouts::approve_request(p, t, changes, reservations).await,
        }
    }

    /// Proposes a layout for one GPU by hand (an admin's edit), if its layout is still at `change.base_version` and
    /// no other proposal is open for it.
    pub async fn propose_layout(&self, change: &LayoutChange, actor: &str) -> Result<LayoutProposal, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::layouts::propose_layout(p, change, actor).await,
            Db::Postgres(p) => postgres::layouts::propose_layout(p, change, actor).await,
        }
    }

    /// A tenant's allocations that hold an instance, oldest first.
    pub async fn tenant_allocations(&self, tenant_id: &str) -> Result<Vec<Allocation>, StoreError> {
        Ok(self.live_allocations().await?.into_iter().filter(|a| a.tenant_id == tenant_id).collect())
    }

    /// Allocations that hold their instance (reserved or active).
    pub async fn live_allocations(&self) -> Result<Vec<Allocation>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::layouts::live_allocations(p).await,
            Db::Postgres(p) => postgres::layouts::live_allocations(p).await,
        }
    }

    /// Layout proposals, newest first, optionally only in one state.
    pub async fn proposals(&self, state: Option<&str>) -> Result<Vec<LayoutProposal>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::layouts::proposals(p, state).await,
            Db::Postgres(p) => postgres::layouts::proposals(p, state).await,
        }
    }

    /// Approves a proposal (applies the layout if the GPU is still on the version planned on and nothing it
    /// destroys is in use) or rejects it (its reserved allocations are released and their requests fail, with the
    /// reason).
    pub async fn decide_proposal(
        &self,
        id: &str,
        approve: bool,
        reason: &str,
        actor: &str,
    ) -> Result<LayoutProposal, StoreError> {
        let _changing = self.changing();
        match &self.db {
            Db::Sqlite(p) => sqlite::layouts::decide_proposal(p, id, approve, reason, actor).await,
            Db::Postgres(p) => postgres::layouts::decide_proposal(p, id, approve, reason, actor).await,
        }
    }

    /// Turns auto-layout on or off for a GPU.
    pub async fn set_auto_layout(&self, gpu_id: &str, enabled: bool, actor: &str) -> Result<Gpu, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::fleet::set_flag(p, gpu_id, "auto_layout", enabled, actor).await,
            Db::Postgres(p) => postgres::fleet::set_flag(p, gpu_id, "auto_layout", enabled, actor).await,
        }
    }

    /// Moves every active request whose duration has run out at `now` to expired (which frees its instances).
    /// Returns how many expired.
    pub async fn expire_due(&self, now: i64) -> Result<usize, StoreError> {
        let due = match &self.db {
            Db::Sqlite(p) => sqlite::due_requests(p, now).await?,
            Db::Postgres(p) => postgres::due_requests(p, now).await?,
        };
        let mut expired = 0;
        for (id, version) in due {
            let t = Transition {
                id: &id,
                expected_version: Some(version),
                to: RequestState::Expired,
                reason: None,
                actor: "system:expiry",
            };
            match self.transition(t).await {
                Ok(_) => expired += 1,
                // Changed meanwhile (released, failed): the next sweep sees its new state.
                Err(StoreError::Conflict { .. } | StoreError::Transition(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(expired)
    }

    /// Audit entries about `object`, oldest first.
    pub async fn audit(&self, object: &str) -> Result<Vec<AuditEntry>, StoreError> {
        match &self.db {
            Db::Sqlite(p) => sqlite::audit(p, object).await,
            Db::Postgres(p) => postgres::audit(p, object).await,
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
