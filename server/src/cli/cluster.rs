//! `tessera cluster ...`: the Kubernetes clusters Tessera governs, the namespaces tenants get in them, and which
//! cluster each node is in (platform admins; `namespaces` for a tenant's members too).

use std::io::Write;

use clap::Subcommand;
use reqwest::Method;
use tessera_api::clusters::{
    ClusterUpdate, ClusterView, GovernNamespace, Mode, NamespaceView, NewCluster, NodeCluster,
};

use super::api::{Answer, Api, print, say};
use super::error::CliError;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Register a cluster: how its pods get devices and how the server reaches it.
    Create {
        /// Cluster name (a DNS label).
        name: String,
        /// `dra` (NVIDIA's DRA driver: each allocation a ResourceClaim on exactly its device) or `device_plugin`.
        #[arg(long, value_parser = parse_mode)]
        mode: Mode,
        /// The name of a kubeconfig in the server's settings; without it, the server's in-cluster service account.
        #[arg(long)]
        kubeconfig: Option<String>,
    },
    /// Every cluster with its tenants' namespaces and its nodes.
    List,
    /// Show a cluster.
    Get {
        /// Cluster id or name.
        cluster: String,
    },
    /// Change a cluster's mode or credentials.
    Update {
        /// Cluster id or name.
        cluster: String,
        /// A new mode.
        #[arg(long, value_parser = parse_mode)]
        mode: Option<Mode>,
        /// A kubeconfig name from the server's settings.
        #[arg(long, conflicts_with = "in_cluster")]
        kubeconfig: Option<String>,
        /// Reach it with the server's in-cluster service account.
        #[arg(long)]
        in_cluster: bool,
    },
    /// Forget a cluster (refused while namespaces of it belong to tenants).
    Delete {
        /// Cluster id or name.
        cluster: String,
    },
    /// Give a namespace of a cluster to a tenant.
    Govern {
        /// Cluster id or name.
        cluster: String,
        /// Namespace.
        namespace: String,
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
    /// Give a namespace up: Tessera no longer governs it.
    Release {
        /// Cluster id or name.
        cluster: String,
        /// Namespace.
        namespace: String,
    },
    /// Put a node in a cluster, or in none with `--none`.
    Node {
        /// Node id or name.
        node: String,
        /// Cluster id or name.
        #[arg(required_unless_present = "none")]
        cluster: Option<String>,
        /// In no cluster.
        #[arg(long, conflicts_with = "cluster")]
        none: bool,
    },
    /// A tenant's namespaces in every cluster (its members too).
    Namespaces {
        /// Tenant id or name.
        #[arg(long)]
        tenant: String,
    },
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    Mode::parse(text).ok_or_else(|| format!("`{text}`: use dra or device_plugin"))
}

/// Says what was done for answers without a body, or prints the problem.
fn done(out: &mut dyn Write, answer: Answer<()>, what: &str) -> Result<u8, CliError> {
    if let Answer::Ok(()) = answer {
        say(what);
    }
    match answer {
        Answer::Ok(()) => Ok(super::EXIT_OK),
        refused => print(out, refused),
    }
}

pub(super) async fn run(api: &Api, cmd: ClusterCommand, out: &mut dyn Write) -> Result<u8, CliError> {
    match cmd {
        ClusterCommand::Create { name, mode, kubeconfig } => {
            let body = NewCluster { name, mode, kubeconfig };
            print(out, api.call::<_, ClusterView>(Method::POST, "/api/v1/clusters", Some(&body), None).await?)
        }
        ClusterCommand::List => print(out, api.get::<Vec<ClusterView>>("/api/v1/clusters").await?),
        ClusterCommand::Get { cluster } => {
            print(out, api.get::<ClusterView>(&format!("/api/v1/clusters/{cluster}")).await?)
        }
        ClusterCommand::Update { cluster, mode, kubeconfig, in_cluster } => {
            let kubeconfig = if in_cluster { Some(None) } else { kubeconfig.map(Some) };
            let body = ClusterUpdate { mode, kubeconfig };
            let path = format!("/api/v1/clusters/{cluster}");
            print(out, api.call::<_, ClusterView>(Method::PATCH, &path, Some(&body), None).await?)
        }
        ClusterCommand::Delete { cluster } => {
            let path = format!("/api/v1/clusters/{cluster}");
            let answer = api.call::<(), ()>(Method::DELETE, &path, None, None).await?;
            done(out, answer, &format!("Cluster {cluster} is forgotten."))
        }
        ClusterCommand::Govern { cluster, namespace, tenant } => {
            let path = format!("/api/v1/clusters/{cluster}/namespaces/{namespace}");
            let body = GovernNamespace { tenant };
            print(out, api.call::<_, NamespaceView>(Method::PUT, &path, Some(&body), None).await?)
        }
        ClusterCommand::Release { cluster, namespace } => {
            let path = format!("/api/v1/clusters/{cluster}/namespaces/{namespace}");
            let answer = api.call::<(), ()>(Method::DELETE, &path, None, None).await?;
            done(out, answer, &format!("Namespace {namespace} of cluster {cluster} is no longer governed."))
        }
        ClusterCommand::Node { node, cluster, none } => {
            let body = NodeCluster { cluster: if none { None } else { cluster.clone() } };
            let path = format!("/api/v1/nodes/{node}/cluster");
            let answer = api.call::<_, ()>(Method::PUT, &path, Some(&body), None).await?;
            let what = match &cluster {
                Some(c) if !none => format!("Node {node} is in cluster {c}."),
                _ => format!("Node {node} is in no cluster."),
            };
            done(out, answer, &what)
        }
        ClusterCommand::Namespaces { tenant } => {
            print(out, api.get::<Vec<NamespaceView>>(&format!("/api/v1/tenants/{tenant}/namespaces")).await?)
        }
    }
}
