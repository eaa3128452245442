//! Notifications: the events outbox (`events`), what each user reads of it (`inbox`), webhook endpoints
//! (`webhooks`) and their deliveries (`deliveries`), the e-mail outbox (`email`), the dispatcher between them
//! (`dispatch`), reminders of ends (`reminders`), findings told once (`notices`) and what is forgotten when
//! (`retention`). One SQL body for both backends.
//!
//! Every audit entry whose action tells of an event (`tessera_core::event::from_audit`) writes the event in the same
//! transaction, so a change that rolls back has no event and a committed one always has. The dispatcher
//! ([`Store::dispatch_events`](crate::Store::dispatch_events)) turns each event into one delivery per matching
//! endpoint and subscribed user; the senders claim due deliveries for a lease (`lease`), send them and record how it
//! went. On PostgreSQL replicas claim with `FOR UPDATE SKIP LOCKED`, so each delivery is sent by one of them.

mod deliveries;
mod dispatch;
mod email;
mod events;
mod inbox;
mod lease;
mod notices;
mod reminders;
mod retention;
mod webhooks;

pub use deliveries::{Claimed, DeliveryRecord, Sent};
pub use email::{ClaimedEmail, EmailRecord, SentEmail};
pub use events::EventRecord;
pub use reminders::REMINDER;
pub use webhooks::{NewWebhook, StoredSecrets, WebhookRecord};
