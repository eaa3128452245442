//! The request writer: creations queue here and one task commits whatever queued up meanwhile in one
//! transaction. State only; the requests service decides what to create.

use tessera_core::quota::Usage;
use tessera_core::request::{RequestState, SliceSpec};
use tokio::sync::{mpsc, oneshot};

use tessera_store::batch::MAX_BATCH;
use tessera_store::{Created, NewRequest, Store, StoreError};

/// Queues request creations for one writer task, which creates whatever has queued up meanwhile in one
/// transaction ([`tessera_store::Store::create_requests`]): under load, hundreds of creations share one commit
/// instead of queueing for the write lock one by one. Each still gets its own outcome, decided in arrival order.
#[derive(Debug, Clone)]
pub struct CreateQueue(mpsc::Sender<Job>);

/// One queued creation, owned, and where its outcome goes.
#[derive(Debug)]
struct Job {
    tenant_id: String,
    spec: SliceSpec,
    count: u32,
    reason: String,
    charge: Usage,
    state: RequestState,
    actor: String,
    idempotency: Option<(String, String)>,
    duration_s: Option<u64>,
    priority: tessera_core::cohort::Priority,
    replaces: Option<String>,
    reply: oneshot::Sender<Result<Created, StoreError>>,
}

impl Job {
    fn as_new(&self) -> NewRequest<'_> {
        NewRequest {
            tenant_id: &self.tenant_id,
            spec: &self.spec,
            count: self.count,
            reason: &self.reason,
            charge: &self.charge,
            state: self.state,
            actor: &self.actor,
            idempotency: self.idempotency.as_ref().map(|(u, k)| (u.as_str(), k.as_str())),
            duration_s: self.duration_s,
            priority: self.priority,
            replaces: self.replaces.as_deref(),
        }
    }
}

/// Creations that may wait for the writer; past it, callers wait to queue.
const QUEUE_DEPTH: usize = 4096;

impl CreateQueue {
    /// Starts the writer task for `store`. It ends when every `CreateQueue` clone is gone.
    pub fn start(store: Store) -> CreateQueue {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(write_batches(store, rx));
        CreateQueue(tx)
    }

    /// Creates a request (see [`tessera_store::Store::create_request`]), in the next batch. Once queued, the
    /// creation goes ahead even if the caller stops waiting; a retry with the same idempotency key finds it.
    pub async fn create(&self, new: NewRequest<'_>) -> Result<Created, StoreError> {
        let (reply, outcome) = oneshot::channel();
        let job = Job {
            tenant_id: new.tenant_id.to_string(),
            spec: new.spec.clone(),
            count: new.count,
            reason: new.reason.to_string(),
            charge: new.charge.clone(),
            state: new.state,
            actor: new.actor.to_string(),
            idempotency: new.idempotency.map(|(u, k)| (u.to_string(), k.to_string())),
            duration_s: new.duration_s,
            priority: new.priority,
            replaces: new.replaces.map(str::to_string),
            reply,
        };
        let stopped = || StoreError::Failed("the request writer stopped before answering".to_string());
        self.0.send(job).await.map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?
    }
}

async fn write_batches(store: Store, mut queue: mpsc::Receiver<Job>) {
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        let batch = std::mem::take(&mut jobs);
        let store = store.clone();
        // Each batch in its own task: were one ever to panic, its callers would get an error and the writer would
        // go on with the next.
        let _ = tokio::spawn(async move { write_batch(&store, batch).await }).await;
    }
}

async fn write_batch(store: &Store, jobs: Vec<Job>) {
    let batch: Vec<NewRequest<'_>> = jobs.iter().map(Job::as_new).collect();
    let outcomes = store.create_requests(&batch).await;
    drop(batch);
    for (job, outcome) in jobs.into_iter().zip(outcomes) {
        let _ = job.reply.send(outcome);
    }
}
