//! E-mail notifications: each user chooses the event types mailed to them (`email_prefs.rs`); the delivery
//! worker (started with the webhooks' in `notifications.rs`) sends what is due over SMTP ([`Mailer::round`]).
//!
//! A user is mailed only events they may read in the inbox (their tenants'; every one for platform admins), made
//! after their choice, at the address their identity provider gave (else their name, when it is one). The due
//! deliveries of one user are sent as one message: plain text and HTML, each event with a link to where the portal
//! shows it. A message the server refuses for good (a 5xx answer, an address it cannot take) is failed at once;
//! otherwise it is tried again with the webhooks' backoff for up to a day.

use std::time::Duration;

use futures_util::StreamExt;
use lettre::message::header::{Header, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde::Deserialize;
use tessera_core::event::{self};

use crate::error::ApiError;
use tessera_store::Store;
use tessera_store::notifications::{ClaimedEmail, SentEmail};

/// The `[email]` table of the settings file. `TESSERA_SMTP_URL`, `TESSERA_EMAIL_FROM` and `TESSERA_PUBLIC_URL` win.
///
/// ```toml
/// [email]
/// smtp_url = "smtps://tessera:password@mail.example.com"   # or smtp://host:587?tls=required
/// from = "Tessera <tessera@example.com>"
/// portal_url = "https://gpus.example.com"                 # links in mail point here
/// ```
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// The SMTP server, as lettre reads it: `smtps://user:pass@host[:port]`, `smtp://host:port?tls=required`,
    /// `smtp://host:port` (no TLS: for a relay on the same host only). Unset: no mail is sent.
    pub smtp_url: Option<String>,
    /// The sender, `Name <address>` or `address`.
    pub from: Option<String>,
    /// The portal's address as users reach it, for links (default: `http://` and the listen address).
    pub portal_url: Option<String>,
}

impl std::fmt::Debug for EmailConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailConfig")
            .field("smtp_url", &self.smtp_url.as_deref().map(crate::redact::url))
            .field("from", &self.from)
            .field("portal_url", &self.portal_url)
            .finish()
    }
}

/// Mail settings, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct EmailSettings {
    /// The SMTP server's URL.
    pub smtp_url: String,
    /// The sender.
    pub from: String,
    /// The portal's address, without a trailing `/`.
    pub portal_url: String,
}

impl std::fmt::Debug for EmailSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailSettings")
            .field("smtp_url", &crate::redact::url(&self.smtp_url))
            .field("from", &self.from)
            .field("portal_url", &self.portal_url)
            .finish()
    }
}

impl EmailConfig {
    /// The settings to send with, or `None` without an SMTP server; an error names what is wrong.
    pub fn resolve(
        mut self,
        env: impl Fn(&str) -> Option<String>,
        listen: &str,
    ) -> Result<Option<EmailSettings>, String> {
        if let Some(v) = env("TESSERA_SMTP_URL") {
            self.smtp_url = Some(v);
        }
        if let Some(v) = env("TESSERA_EMAIL_FROM") {
            self.from = Some(v);
        }
        if let Some(v) = env("TESSERA_PUBLIC_URL") {
            self.portal_url = Some(v);
        }
        let Some(smtp_url) = self.smtp_url.map(|u| u.trim().to_string()).filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        AsyncSmtpTransport::<Tokio1Executor>::from_url(&smtp_url)
            .map_err(|e| format!("the SMTP URL ({}) is not one lettre reads: {e}", crate::redact::url(&smtp_url)))?;
        let from = self.from.ok_or("mail needs a sender: `from` in [email] or TESSERA_EMAIL_FROM")?;
        from.parse::<Mailbox>().map_err(|e| format!("the sender `{from}` is not an address: {e}"))?;
        let portal_url = self.portal_url.unwrap_or_else(|| format!("http://{listen}"));
        let parsed = reqwest::Url::parse(&portal_url).map_err(|e| format!("the portal URL `{portal_url}`: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("the portal URL `{portal_url}` must be http:// or https://"));
        }
        Ok(Some(EmailSettings { smtp_url, from, portal_url: portal_url.trim_end_matches('/').to_string() }))
    }
}

/// Deliveries claimed at once.
const CLAIM_BATCH: u32 = 200;
/// Messages sent at once.
const PARALLEL: usize = 4;
/// How long one message may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(20);
/// How long claimed deliveries are kept from other senders.
const LEASE_MS: i64 = 120_000;
/// Most events told in one message; more wait for the next.
const PER_MESSAGE: usize = 50;

/// `Auto-Submitted: auto-generated` (RFC 3834): mail from a machine, which vacation responders leave alone.
#[derive(Clone)]
struct AutoSubmitted;

impl Header for AutoSubmitted {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Auto-Submitted")
    }

    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(AutoSubmitted)
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "auto-generated".to_string())
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One event as a message tells it.
struct Told {
    title: String,
    about: String,
    link: String,
    details: Vec<(String, String)>,
}

/// The fields of a changed record worth telling (scalars, and short lists such as devices), at most 12.
fn details(after: &serde_json::Value) -> Vec<(String, String)> {
    let Some(obj) = after.as_object() else { return Vec::new() };
    obj.iter()
        .filter(|(k, v)| (!v.is_null() && !k.ends_with("_ms")) || k.as_str() == "expires_at_ms")
        .filter_map(|(k, v)| {
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(_) | serde_json::Value::Bool(_) => v.to_string(),
                serde_json::Value::Null => return None,
                other => other.to_string(),
            };
            let text =
                if k == "expires_at_ms" { v.as_i64().map(tessera_core::clock::iso8601).unwrap_or(text) } else { text };
            let text: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
            (!text.is_empty()).then(|| (k.clone(), text))
        })
        .take(12)
        .collect()
}

fn told(portal: &str, e: &tessera_store::notifications::EventRecord) -> Told {
    let data: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
    let actor = data.get("actor").and_then(|a| a.as_str()).unwrap_or("system");
    let what = event::TYPES.iter().find(|(t, _)| *t == e.kind).map_or(e.kind.as_str(), |(_, d)| d);
    let mut title = what.to_string();
    if let Some(first) = title.get(..1) {
        title.replace_range(..1, &first.to_uppercase());
    }
    let tenant = e.tenant_id.as_deref().map(|t| format!(" in tenant {t}")).unwrap_or_default();
    Told {
        title,
        about: format!("{}{tenant}, by {actor}, at {}", e.subject, tessera_core::clock::iso8601(e.at_ms)),
        link: format!("{portal}{}", event::portal_path(&e.kind, &e.subject, e.tenant_id.as_deref())),
        details: details(data.get("after").unwrap_or(&serde_json::Value::Null)),
    }
}

/// The message telling `to` of `events`: its subject, plain text and HTML.
pub fn compose(portal: &str, events: &[&tessera_store::notifications::EventRecord]) -> (String, String, String) {
    let told: Vec<Told> = events.iter().map(|e| told(portal, e)).collect();
    let subject = match told.as_slice() {
        [one] => format!("[Tessera] {}: {}", one.title, events[0].subject),
        many => format!("[Tessera] {} updates", many.len()),
    };
    let mut text = String::new();
    let mut html = String::from(
        "<!doctype html><html><body style=\"font-family:sans-serif\"><h2 style=\"font-size:16px\">Tessera</h2><ul>",
    );
    for t in &told {
        text.push_str(&format!("* {}\n  {}\n", t.title, t.about));
        html.push_str(&format!("<li><p><strong>{}</strong><br>{}", escape(&t.title), escape(&t.about)));
        for (k, v) in &t.details {
            text.push_str(&format!("    {k}: {v}\n"));
        }
        if !t.details.is_empty() {
            html.push_str("<br><small>");
            let cells: Vec<String> = t.details.iter().map(|(k, v)| format!("{}: {}", escape(k), escape(v))).collect();
            html.push_str(&cells.join(" &middot; "));
            html.push_str("</small>");
        }
        text.push_str(&format!("  Open: {}\n\n", t.link));
        html.push_str(&format!("<br><a href=\"{0}\">{0}</a></p></li>", escape(&t.link)));
    }
    let settings = format!("{portal}/inbox");
    text.push_str(&format!("You receive these because you chose them; change which at {settings}\n"));
    html.push_str(&format!(
        "</ul><p><small>You receive these because you chose them; change which at <a href=\"{0}\">{0}</a>.</small></p>\
         </body></html>",
        escape(&settings)
    ));
    (subject, text, html)
}

/// Sends mail: a transport and the settings.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    domain: String,
    portal_url: String,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer").field("from", &self.from).field("portal_url", &self.portal_url).finish()
    }
}

impl Mailer {
    /// A mailer for checked settings.
    pub fn new(s: &EmailSettings) -> Result<Mailer, String> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(&s.smtp_url)
            .map_err(|e| e.to_string())?
            .timeout(Some(SEND_TIMEOUT))
            .build();
        let from: Mailbox = s.from.parse().map_err(|e| format!("{e}"))?;
        let domain = from.email.domain().to_string();
        Ok(Mailer { transport, from, domain, portal_url: s.portal_url.clone() })
    }

    /// Claims what is due, sends one message per recipient, records how it went; how many deliveries it handled.
    pub async fn round(&self, store: &Store, cap_ms: i64) -> Result<usize, ApiError> {
        let claimed = store.claim_emails(CLAIM_BATCH, LEASE_MS).await?;
        if claimed.is_empty() {
            return Ok(0);
        }
        let n = claimed.len();
        let mut by_user: Vec<Vec<ClaimedEmail>> = Vec::new();
        let mut later: Vec<ClaimedEmail> = Vec::new();
        for c in claimed {
            match by_user.iter_mut().find(|g| g[0].user_id == c.user_id && g[0].address == c.address) {
                Some(g) if g.len() >= PER_MESSAGE => later.push(c),
                Some(g) => g.push(c),
                None => by_user.push(vec![c]),
            }
        }
        let sent: Vec<SentEmail> = futures_util::stream::iter(by_user)
            .map(|group| self.send(group))
            .buffer_unordered(PARALLEL)
            .collect::<Vec<Vec<SentEmail>>>()
            .await
            .into_iter()
            .flatten()
            .collect();
        store.finish_emails(&sent, cap_ms).await?;
        // What did not fit one message is released at once for the next round.
        store.release_emails(&later.iter().map(|c| c.delivery).collect::<Vec<_>>()).await?;
        Ok(n)
    }

    /// Sends one user's due deliveries as one message.
    async fn send(&self, group: Vec<ClaimedEmail>) -> Vec<SentEmail> {
        let outcome = |ok: bool, permanent: bool, error: String| -> Vec<SentEmail> {
            group
                .iter()
                .map(|c| SentEmail {
                    delivery: c.delivery,
                    attempts: c.attempts,
                    first_at_ms: c.first_at_ms,
                    ok,
                    permanent,
                    error: error.clone(),
                })
                .collect()
        };
        let to: Mailbox = match group[0].address.parse() {
            Ok(a) => a,
            Err(e) => return outcome(false, true, format!("`{}` is not an e-mail address: {e}", group[0].address)),
        };
        let events: Vec<&tessera_store::notifications::EventRecord> = group.iter().map(|c| &c.event).collect();
        let (subject, text, html) = compose(&self.portal_url, &events);
        // The same id on every attempt of these deliveries, so that a receiver can tell a repeat.
        let id = format!("<{}.{}@{}>", group[0].event.id, group[0].delivery, self.domain);
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(subject)
            .message_id(Some(id))
            .header(AutoSubmitted)
            .multipart(MultiPart::alternative_plain_html(text, html));
        let message = match message {
            Ok(m) => m,
            Err(e) => return outcome(false, true, format!("cannot build the message: {e}")),
        };
        match self.transport.send(message).await {
            Ok(_) => outcome(true, false, String::new()),
            Err(e) => outcome(false, e.is_permanent(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_store::notifications::EventRecord;

    fn event(kind: &str, after: serde_json::Value) -> EventRecord {
        EventRecord {
            seq: 1,
            id: "ev1".into(),
            kind: kind.into(),
            tenant_id: Some("t1".into()),
            subject: "request/r1".into(),
            at_ms: 0,
            data: serde_json::json!({"actor": "user:ada", "action": "x", "before": null, "after": after}).to_string(),
        }
    }

    #[test]
    fn a_message_tells_each_event_with_a_link_and_escapes_what_users_wrote() {
        let a = event(
            "request.active",
            serde_json::json!({"reason": "<script>x</script>", "node": "gpu-1",
            "created_at_ms": 5, "expires_at_ms": 86_400_000, "note": null}),
        );
        let (subject, text, html) = compose("https://p", &[&a]);
        assert_eq!(subject, "[Tessera] A request's slices are ready to use: request/r1");
        assert!(text.contains("Open: https://p/requests/r1") && text.contains("node: gpu-1"), "{text}");
        assert!(text.contains("expires_at_ms: 1970-01-02T00:00:00"), "times are written out: {text}");
        assert!(!text.contains("created_at_ms") && !text.contains("note"), "{text}");
        assert!(html.contains("&lt;script&gt;") && !html.contains("<script>"), "{html}");
        assert!(html.contains("<a href=\"https://p/requests/r1\">"), "{html}");
        let b = event("layout.proposed", serde_json::json!({}));
        let (subject, text, _) = compose("https://p", &[&a, &b]);
        assert_eq!(subject, "[Tessera] 2 updates");
        assert!(text.contains("https://p/approvals"), "{text}");
    }
}
