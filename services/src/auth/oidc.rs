//! OpenID Connect relying party: provider metadata from discovery, the provider's signing keys (JWKS) cached and
//! refetched on an unknown `kid` no more often than a floor, the authorization-code flow with PKCE, `state` and
//! `nonce`, and validation of ID tokens and JWT access tokens.
//!
//! Only the provider's asymmetric keys verify tokens: the algorithm must be one its key allows (RS*, PS*, ES256,
//! ES384, EdDSA). `none`, HMAC and any algorithm its key was not published for are rejected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The provider's metadata (the fields Tessera uses).
#[derive(Debug, Clone, Deserialize)]
pub struct Metadata {
    /// Must equal the configured issuer.
    pub issuer: String,
    /// Where browsers go to sign in.
    pub authorization_endpoint: String,
    /// Where codes become tokens.
    pub token_endpoint: String,
    /// The signing keys.
    pub jwks_uri: String,
    /// Claims for an access token, when the ID token lacks the groups.
    #[serde(default)]
    pub userinfo_endpoint: Option<String>,
    /// RP-initiated logout, when offered.
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
    /// Client authentication methods at the token endpoint.
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
}

/// How to reach and trust the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSettings {
    /// Issuer URL, exactly as the provider's tokens carry it.
    pub issuer: String,
    /// This server's client id.
    pub client_id: String,
    /// Its secret (confidential client); `None` for a public client (PKCE only).
    pub client_secret: Option<String>,
    /// Scopes to ask for.
    pub scopes: Vec<String>,
    /// Where the provider sends the browser back (`.../auth/callback`).
    pub redirect_url: String,
    /// Where the provider sends the browser after logout.
    pub post_logout_redirect_url: String,
    /// The `aud` that API access tokens must carry.
    pub api_audience: String,
    /// Clock skew allowed on `exp`, `nbf` and `iat`.
    pub leeway: Duration,
    /// Least time between two JWKS fetches caused by unknown key ids.
    pub jwks_refetch_floor: Duration,
    /// Keys older than this are refetched before use.
    pub jwks_max_age: Duration,
}

/// Why a token or a provider exchange was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url parts with a JSON header.
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(String),
    /// `none`, HMAC, or an algorithm the provider's key was not published for.
    #[error("algorithm {0} is not allowed; only the provider's asymmetric keys verify tokens")]
    AlgorithmNotAllowed(String),
    /// No provider key has the token's `kid`, even after refetching.
    #[error("no provider key has id `{0}`")]
    UnknownKey(String),
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    BadSignature,
    /// `exp` is in the past.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// `iss` is another provider.
    #[error("the token was issued by another provider")]
    WrongIssuer,
    /// `aud` does not name this server.
    #[error("the token is meant for another audience")]
    WrongAudience,
    /// A claim is missing or has the wrong type.
    #[error("the token lacks a valid `{0}` claim")]
    MissingClaim(String),
    /// The ID token's `nonce` is not the one this login sent.
    #[error("the ID token's nonce does not match this login")]
    NonceMismatch,
    /// The provider could not be reached or answered nonsense.
    #[error("the identity provider is unavailable: {0}")]
    Provider(String),
    /// The provider refused the exchange (e.g. a wrong PKCE verifier or a used code).
    #[error("the identity provider refused: {0}")]
    Refused(String),
}

impl TokenError {
    /// Stable code for problem reports.
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Malformed(_) => "token_malformed",
            TokenError::AlgorithmNotAllowed(_) => "token_algorithm_not_allowed",
            TokenError::UnknownKey(_) => "token_unknown_key",
            TokenError::BadSignature => "token_bad_signature",
            TokenError::Expired => "token_expired",
            TokenError::NotYetValid => "token_not_yet_valid",
            TokenError::WrongIssuer => "token_wrong_issuer",
            TokenError::WrongAudience => "token_wrong_audience",
            TokenError::MissingClaim(_) => "token_missing_claim",
            TokenError::NonceMismatch => "token_nonce_mismatch",
            TokenError::Provider(_) => "identity_provider_unavailable",
            TokenError::Refused(_) => "identity_provider_refused",
        }
    }
}

fn from_jwt_error(e: jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
        ErrorKind::InvalidAudience => TokenError::WrongAudience,
        ErrorKind::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
        ErrorKind::InvalidAlgorithm => TokenError::AlgorithmNotAllowed("(not the key's)".to_string()),
        _ => TokenError::Malformed(e.to_string()),
    }
}

/// One usable provider key.
#[derive(Clone)]
struct Key {
    decoding: DecodingKey,
    algorithms: Vec<Algorithm>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("algorithms", &self.algorithms).finish_non_exhaustive()
    }
}

/// The asymmetric algorithms a JWK may verify: its `alg` if it names one, else every one its key type allows.
fn key_algorithms(jwk: &Jwk) -> Vec<Algorithm> {
    let by_type: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => vec![],
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
        // Symmetric keys never verify tokens here.
        _ => vec![],
    };
    match jwk.common.key_algorithm {
        None => by_type,
        Some(named) => {
            let named = match named {
                KeyAlgorithm::RS256 => Algorithm::RS256,
                KeyAlgorithm::RS384 => Algorithm::RS384,
                KeyAlgorithm::RS512 => Algorithm::RS512,
                KeyAlgorithm::PS256 => Algorithm::PS256,
                KeyAlgorithm::PS384 => Algorithm::PS384,
                KeyAlgorithm::PS512 => Algorithm::PS512,
                KeyAlgorithm::ES256 => Algorithm::ES256,
                KeyAlgorithm::ES384 => Algorithm::ES384,
                KeyAlgorithm::EdDSA => Algorithm::EdDSA,
                _ => return vec![],
            };
            by_type.into_iter().filter(|a| *a == named).collect()
        }
    }
}

#[derive(Debug, Default)]
struct Keys {
    by_id: HashMap<String, Key>,
    /// Keys without a `kid`.
    anonymous: Vec<Key>,
    fetched_at: Option<Instant>,
}

/// The relying party for one provider.
#[derive(Debug)]
pub struct Provider {
    settings: ProviderSettings,
    http: reqwest::Client,
    metadata: tokio::sync::Mutex<MetadataSlot>,
    keys: Mutex<Arc<Keys>>,
    /// Held while fetching keys, so that many requests with an unknown `kid` cause one fetch; holds the last
    /// failed fetch.
    fetching: tokio::sync::Mutex<Option<(Instant, TokenError)>>,
}

/// The metadata once fetched, and the last failed fetch.
type MetadataSlot = (Option<Arc<Metadata>>, Option<(Instant, TokenError)>);

/// After a failed fetch from the provider, how long requests fail at once instead of asking again.
pub const PROVIDER_RETRY: Duration = Duration::from_secs(5);

/// What a token exchange gives back.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenResponse {
    /// The ID token.
    pub id_token: Option<String>,
    /// The access token (for userinfo).
    pub access_token: Option<String>,
}

/// A fresh random secret: 256 bits, base64url.
pub fn random_secret() -> String {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes[..])
}

/// The S256 PKCE challenge of a verifier.
pub fn pkce_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

impl Provider {
    /// A relying party; nothing is fetched until first needed.
    pub fn new(settings: ProviderSettings) -> Provider {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Provider {
            settings,
            http,
            metadata: tokio::sync::Mutex::new((None, None)),
            keys: Mutex::new(Arc::new(Keys::default())),
            fetching: tokio::sync::Mutex::new(None),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    /// The provider's metadata, from discovery (fetched once, then kept).
    pub async fn metadata(&self) -> Result<Arc<Metadata>, TokenError> {
        let mut slot = self.metadata.lock().await;
        if let Some(m) = slot.0.as_ref() {
            return Ok(m.clone());
        }
        if let Some((at, e)) = &slot.1
            && at.elapsed() < PROVIDER_RETRY
        {
            return Err(e.clone());
        }
        let url = format!("{}/.well-known/openid-configuration", self.settings.issuer.trim_end_matches('/'));
        let fetched = self.get_json::<Metadata>(&url).await.and_then(|metadata| {
            if metadata.issuer == self.settings.issuer {
                Ok(metadata)
            } else {
                Err(TokenError::Provider(format!(
                    "discovery says the issuer is `{}`, not the configured `{}`",
                    metadata.issuer, self.settings.issuer
                )))
            }
        });
        match fetched {
            Ok(metadata) => {
                let metadata = Arc::new(metadata);
                *slot = (Some(metadata.clone()), None);
                Ok(metadata)
            }
            Err(e) => {
                slot.1 = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, TokenError> {
        let response = match self.http.get(url).send().await {
            Ok(response) => response,
            // A pooled connection that the provider closed just as it was reused (its keep-alive timeout ran out)
            // fails without the request having been seen; these are idempotent reads, so one fresh try is safe.
            Err(e) if !e.is_timeout() => {
                tracing::debug!(error = %e, url, "identity provider request failed; trying once more");
                self.http.get(url).send().await.map_err(|e| TokenError::Provider(format!("{url}: {e}")))?
            }
            Err(e) => return Err(TokenError::Provider(format!("{url}: {e}"))),
        };
        if !response.status().is_success() {
            return Err(TokenError::Provider(format!("{url} answered {}", response.status())));
        }
        response.json().await.map_err(|e| TokenError::Provider(format!("{url}: {e}")))
    }

    fn current_keys(&self) -> Arc<Keys> {
        self.keys.lock().map(|k| k.clone()).unwrap_or_default()
    }

    /// Fetches the key set unless another caller fetched it since `seen` (or, with `floor`, less than the floor
    /// ago).
    async fn refresh_keys(&self, seen: Option<Instant>, floor: bool) -> Result<Arc<Keys>, TokenError> {
        let mut last_failure = self.fetching.lock().await;
        let current = self.current_keys();
        if current.fetched_at != seen {
            return Ok(current);
        }
        if floor && current.fetched_at.is_some_and(|at| at.elapsed() < self.settings.jwks_refetch_floor) {
            return Ok(current);
        }
        // A provider that just failed is not asked again at once, however many tokens arrive.
        if let Some((at, e)) = last_failure.as_ref()
            && at.elapsed() < PROVIDER_RETRY
        {
            return Err(e.clone());
        }
        let fetched = match self.metadata().await {
            Ok(metadata) => self.get_json::<JwkSet>(&metadata.jwks_uri).await,
            Err(e) => Err(e),
        };
        let set = match fetched {
            Ok(set) => {
                *last_failure = None;
                set
            }
            Err(e) => {
                *last_failure = Some((Instant::now(), e.clone()));
                return Err(e);
            }
        };
        let mut keys = Keys { fetched_at: Some(Instant::now()), ..Keys::default() };
        for jwk in &set.keys {
            if jwk.common.public_key_use.as_ref().is_some_and(|u| *u != PublicKeyUse::Signature) {
                continue;
            }
            let algorithms = key_algorithms(jwk);
            if algorithms.is_empty() {
                continue;
            }
            let Ok(decoding) = DecodingKey::from_jwk(jwk) else { continue };
            let key = Key { decoding, algorithms };
            match &jwk.common.key_id {
                Some(kid) => {
                    keys.by_id.insert(kid.clone(), key);
                }
                None => keys.anonymous.push(key),
            }
        }
        let keys = Arc::new(keys);
        if let Ok(mut slot) = self.keys.lock() {
            *slot = keys.clone();
        }
        tracing::info!(keys = set.keys.len(), "identity provider keys fetched");
        Ok(keys)
    }

    /// The key for a token's `kid`: from the cache, else from a refetch (at most once per floor).
    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<Key, TokenError> {
        let mut keys = self.current_keys();
        if keys.fetched_at.is_none_or(|at| at.elapsed() > self.settings.jwks_max_age) {
            match self.refresh_keys(keys.fetched_at, false).await {
                Ok(fresh) => keys = fresh,
                // Keys we had are still good while the provider is away.
                Err(e) if keys.fetched_at.is_some() => tracing::warn!(error = %e, "keeping the provider's keys"),
                Err(e) => return Err(e),
            }
        }
        let pick = |keys: &Keys| -> Option<Key> {
            match kid {
                Some(kid) => keys.by_id.get(kid).cloned(),
                None => {
                    let mut fitting =
                        keys.by_id.values().chain(&keys.anonymous).filter(|k| k.algorithms.contains(&alg));
                    match (fitting.next(), fitting.next()) {
                        (Some(k), None) => Some(k.clone()),
                        _ => None,
                    }
                }
            }
        };
        if let Some(key) = pick(&keys) {
            return Ok(key);
        }
        // Perhaps the provider rotated its keys.
        let keys = self.refresh_keys(keys.fetched_at, true).await?;
        pick(&keys).ok_or_else(|| TokenError::UnknownKey(kid.unwrap_or("(none)").to_string()))
    }

    /// Verifies a token's signature and standard claims; returns its claims.
    async fn verify(&self, token: &str, audience: &str) -> Result<Map<String, Value>, TokenError> {
        let header = header_of(token)?;
        let key = self.key_for(header.kid.as_deref(), header.alg).await?;
        if !key.algorithms.contains(&header.alg) {
            return Err(TokenError::AlgorithmNotAllowed(format!("{:?}", header.alg)));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[audience]);
        validation.leeway = self.settings.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data =
            jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation).map_err(from_jwt_error)?;
        let claims = data.claims;
        if let Some(iat) = claims.get("iat") {
            let iat = iat.as_f64().ok_or_else(|| TokenError::MissingClaim("iat".into()))? as i64;
            let now = tessera_store::now_ms() / 1000;
            if iat > now + self.settings.leeway.as_secs() as i64 {
                return Err(TokenError::NotYetValid);
            }
        }
        Ok(claims)
    }

    /// Validates an ID token from this login: signature, issuer, audience (and `azp` when there are several),
    /// expiry, and the login's nonce.
    pub async fn validate_id_token(&self, token: &str, nonce: &str) -> Result<Map<String, Value>, TokenError> {
        let claims = self.verify(token, &self.settings.client_id).await?;
        let several = matches!(claims.get("aud"), Some(Value::Array(a)) if a.len() > 1);
        match claims.get("azp").and_then(Value::as_str) {
            Some(azp) if azp != self.settings.client_id => return Err(TokenError::WrongAudience),
            None if several => return Err(TokenError::WrongAudience),
            _ => {}
        }
        match claims.get("nonce").and_then(Value::as_str) {
            Some(n) if constant_time_eq(n.as_bytes(), nonce.as_bytes()) => Ok(claims),
            Some(_) => Err(TokenError::NonceMismatch),
            None => Err(TokenError::MissingClaim("nonce".into())),
        }
    }

    /// Validates a JWT access token sent to the API: signature, issuer, the API audience, expiry.
    pub async fn validate_access_token(&self, token: &str) -> Result<Map<String, Value>, TokenError> {
        let header = header_of(token)?;
        // An ID token is not an access token (RFC 9068 types access tokens `at+jwt`; some providers say `JWT`).
        if let Some(typ) = header.typ.as_deref() {
            let typ = typ.to_ascii_lowercase();
            if !matches!(typ.as_str(), "at+jwt" | "application/at+jwt" | "jwt") {
                return Err(TokenError::Malformed(format!("type `{typ}` is not an access token")));
            }
        }
        let claims = self.verify(token, &self.settings.api_audience).await?;
        // Where the API audience is the client id, an ID token (shown to browsers, passed as a logout hint) would
        // pass the audience check: the claims only ID tokens carry tell it apart, and it never works on the API.
        let id_token_claims = ["nonce", "at_hash", "c_hash"].iter().any(|c| claims.contains_key(*c))
            || claims.get("typ").and_then(Value::as_str).is_some_and(|t| t.eq_ignore_ascii_case("id"));
        if self.settings.api_audience == self.settings.client_id && id_token_claims {
            return Err(TokenError::Malformed("an ID token is not an access token".into()));
        }
        Ok(claims)
    }

    /// Where to send the browser to sign in.
    pub async fn authorization_url(&self, state: &str, nonce: &str, verifier: &str) -> Result<String, TokenError> {
        let metadata = self.metadata().await?;
        let mut url = reqwest::Url::parse(&metadata.authorization_endpoint)
            .map_err(|e| TokenError::Provider(format!("authorization endpoint: {e}")))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("redirect_uri", &self.settings.redirect_url)
            .append_pair("scope", &self.settings.scopes.join(" "))
            .append_pair("state", state)
            .append_pair("nonce", nonce)
            .append_pair("code_challenge", &pkce_challenge(verifier))
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// Exchanges an authorization code (with the PKCE verifier) for tokens.
    pub async fn exchange_code(&self, code: &str, verifier: &str) -> Result<TokenResponse, TokenError> {
        let metadata = self.metadata().await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.settings.redirect_url.as_str()),
            ("code_verifier", verifier),
        ];
        let basic = metadata
            .token_endpoint_auth_methods_supported
            .as_ref()
            .is_none_or(|m| m.iter().any(|m| m == "client_secret_basic"));
        let mut request = self.http.post(&metadata.token_endpoint);
        match &self.settings.client_secret {
            Some(secret) if basic => {
                // RFC 6749 2.3.1: id and secret are form-encoded before Basic encoding.
                let enc = |s: &str| {
                    reqwest::Url::parse_with_params("x:", &[("v", s)])
                        .map(|u| u.query().unwrap_or("").trim_start_matches("v=").to_string())
                };
                let (id, secret) = (enc(&self.settings.client_id), enc(secret));
                let (Ok(id), Ok(secret)) = (id, secret) else {
                    return Err(TokenError::Provider("client credentials cannot be encoded".into()));
                };
                request = request.basic_auth(id, Some(secret));
            }
            Some(secret) => {
                form.push(("client_id", self.settings.client_id.as_str()));
                form.push(("client_secret", secret.as_str()));
            }
            None => form.push(("client_id", self.settings.client_id.as_str())),
        }
        let response =
            request.form(&form).send().await.map_err(|e| TokenError::Provider(format!("token endpoint: {e}")))?;
        let status = response.status();
        let body: Value = response.json().await.map_err(|e| TokenError::Provider(format!("token endpoint: {e}")))?;
        if !status.is_success() {
            let error = body.get("error").and_then(Value::as_str).unwrap_or("error");
            let description = body.get("error_description").and_then(Value::as_str).unwrap_or("");
            return Err(TokenError::Refused(format!("{error}: {description}").trim_end_matches(": ").to_string()));
        }
        serde_json::from_value(body).map_err(|e| TokenError::Provider(format!("token endpoint: {e}")))
    }

    /// The userinfo claims for an access token (when the provider has the endpoint).
    pub async fn userinfo(&self, access_token: &str) -> Result<Option<Map<String, Value>>, TokenError> {
        let metadata = self.metadata().await?;
        let Some(url) = &metadata.userinfo_endpoint else { return Ok(None) };
        let response = self
            .http
            .get(url)
            .bearer_auth(access_token)
            .send()
            .await
            .map_err(|e| TokenError::Provider(format!("userinfo: {e}")))?;
        if !response.status().is_success() {
            return Err(TokenError::Provider(format!("userinfo answered {}", response.status())));
        }
        response.json().await.map(Some).map_err(|e| TokenError::Provider(format!("userinfo: {e}")))
    }

    /// RP-initiated logout: where to send the browser, when the provider offers it.
    pub async fn end_session_url(&self, id_token: Option<&str>) -> Option<String> {
        let metadata = self.metadata().await.ok()?;
        let mut url = reqwest::Url::parse(metadata.end_session_endpoint.as_deref()?).ok()?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(hint) = id_token {
                query.append_pair("id_token_hint", hint);
            }
            query
                .append_pair("client_id", &self.settings.client_id)
                .append_pair("post_logout_redirect_uri", &self.settings.post_logout_redirect_url);
        }
        Some(url.into())
    }
}

/// A JWT's header, refusing `none` and anything unparsable with a clear error.
fn header_of(token: &str) -> Result<jsonwebtoken::Header, TokenError> {
    let first = token.split('.').next().unwrap_or("");
    if token.split('.').count() != 3 {
        return Err(TokenError::Malformed("a JWT has three dot-separated parts".into()));
    }
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(first.trim_end_matches('='))
        .map_err(|_| TokenError::Malformed("the header is not base64url".into()))?;
    let value: Value =
        serde_json::from_slice(&raw).map_err(|_| TokenError::Malformed("the header is not JSON".into()))?;
    let alg = value.get("alg").and_then(Value::as_str).unwrap_or("");
    let allowed = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];
    if !allowed.contains(&alg) {
        return Err(TokenError::AlgorithmNotAllowed(if alg.is_empty() { "(none given)".into() } else { alg.into() }));
    }
    jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))
}

/// Compares secrets without leaking where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    }

    #[test]
    fn none_and_hmac_are_refused_before_any_key_is_looked_up() {
        for alg in ["none", "HS256", "HS512", ""] {
            let token = format!("{}.{}.", b64(&serde_json::json!({"alg": alg})), b64(&serde_json::json!({"sub": "x"})));
            assert!(matches!(header_of(&token), Err(TokenError::AlgorithmNotAllowed(_))), "{alg}");
        }
        assert!(matches!(header_of("a.b"), Err(TokenError::Malformed(_))));
        assert!(matches!(header_of("!!.b.c"), Err(TokenError::Malformed(_))));
    }

    #[test]
    fn pkce_challenge_is_rfc7636_s256() {
        // RFC 7636, appendix B.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        assert_ne!(random_secret(), random_secret());
        assert_eq!(random_secret().len(), 64);
    }
}
