//! `tessera-agent`: the node agent. It joins the control plane with a join token, reports the node's GPUs,
//! receives the node's desired spec (pushed over a WebSocket, or long-polled), applies it through a GPU backend,
//! and reports what the node has now.
//!
//! - [`backend`]: the [`backend::GpuBackend`] trait and its simulated implementation.
//! - [`reconcile`]: desired spec against observed state: actions, then status; idempotent.
//! - [`agent`]: joining, the push channel with reconnects, heartbeats and status reports.
//! - [`kube`]: `--kube` mode: the layout and sharing put in effect by GPU Operator (mig-manager, device plugin).
//! - [`attribution`]: who runs each process on the GPUs (user, command, and on Kubernetes the pod and container).
//! - [`telemetry`]: sampling, batching, and the bounded buffer that holds samples while the server is away.

pub mod agent;
pub mod attribution;
pub mod backend;
pub mod kube;
pub mod reconcile;
pub mod telemetry;
