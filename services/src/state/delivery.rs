//! How webhook deliveries are sent: the retry cap and which addresses endpoints may reach.

use tessera_core::event;

use crate::outbound::Reach;

/// Worker settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Longest wait between two attempts of a delivery, ms (`TESSERA_WEBHOOK_RETRY_CAP_S`; default one hour).
    pub retry_cap_ms: i64,
    /// Which addresses tenants' endpoints may reach beyond the internet (`TESSERA_WEBHOOK_ALLOW_INTERNAL`,
    /// `TESSERA_WEBHOOK_ALLOW`; default none). Platform endpoints may reach any.
    pub reach: Reach,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery { retry_cap_ms: event::RETRY_CAP_MS, reach: Reach::default() }
    }
}
