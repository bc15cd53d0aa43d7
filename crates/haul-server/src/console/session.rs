//! The console's sessions: a signed cookie, never the token itself.
//!
//! The cookie is `{role}.{expiry}.{nonce}.{actor}.{mac}`: `operator` or `read`, the
//! expiry in Unix seconds, 16 random bytes (hex), the name the person signed in with
//! (base64url), and the HMAC-SHA-256 of the rest under the session key: the HMAC of
//! every configured token (API and operator) under a random secret the store keeps
//! (`EdgeStore::console_secret`, made by the first api process that needs it). So a
//! session
//! - works on every api process of a deployment (they share the store and the tokens),
//! - dies when the tokens rotate (the key changes with them),
//! - dies when its person signs out (its nonce is kept as ended until it would expire),
//! - lasts at most [`SESSION_LIFETIME`],
//! - cannot be forged or have its role raised without the secret, and a cookie tells
//!   nothing of the tokens: nobody holding one (and the API token) can test guesses of
//!   the operator token against it offline.
//!
//! A state-changing form carries the CSRF token: the HMAC of the cookie under the same
//! key (with its own label), compared in constant time.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The cookie's name.
pub const COOKIE: &str = "haul_console";
/// How long a session lasts from sign-in.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// What a session may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Signed in with an operator token (`HAUL_OPERATOR_TOKEN`): reads and acts.
    Operator,
    /// Signed in with an API token (`HAUL_API_TOKEN`): reads only.
    Read,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Operator => "operator",
            Role::Read => "read",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        match s {
            "operator" => Some(Role::Operator),
            "read" => Some(Role::Read),
            _ => None,
        }
    }
}

/// A signed-in person, from a cookie that checked out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub role: Role,
    /// Who signed in: recorded as the `actor` of every action they take.
    pub actor: String,
    /// Unix seconds.
    pub expires_at: i64,
    /// The session's random nonce (hex): what signing out ends.
    pub nonce: String,
    /// The cookie's value, for the CSRF token.
    cookie: String,
}

/// The key every cookie and CSRF token is signed with: the HMAC-SHA-256 of the tokens
/// (both lists, sorted, so the order they are configured in does not matter) under the
/// store's random `secret`. `None` with no token at all: then nobody can sign in.
pub fn session_key(secret: &[u8; 32], api_tokens: &[String], operator_tokens: &[String]) -> Option<[u8; 32]> {
    let mut all: Vec<(u8, &str)> = api_tokens
        .iter()
        .map(|t| (b'a', t.as_str()))
        .chain(operator_tokens.iter().map(|t| (b'o', t.as_str())))
        .collect();
    if all.is_empty() {
        return None;
    }
    all.sort_unstable();
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any size");
    m.update(b"haul console session key v3");
    for (kind, token) in all {
        m.update(&[kind]);
        m.update(&(token.len() as u64).to_be_bytes());
        m.update(token.as_bytes());
    }
    Some(m.finalize().into_bytes().into())
}

fn mac(key: &[u8; 32], label: &str, text: &str) -> String {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any size");
    m.update(label.as_bytes());
    m.update(&[0]);
    m.update(text.as_bytes());
    URL_SAFE_NO_PAD.encode(m.finalize().into_bytes())
}

/// A person's name as the operator actions take it: `[A-Za-z0-9_.@+-]{1,64}`.
pub fn actor_ok(actor: &str) -> bool {
    !actor.is_empty()
        && actor.chars().count() <= haul_core::event::MAX_OPERATOR_ACTOR_CHARS
        && actor.chars().all(|c| c.is_ascii_alphanumeric() || "_.@+-".contains(c))
}

/// A new session's cookie value, valid until `now_s + SESSION_LIFETIME`.
pub fn issue(key: &[u8; 32], role: Role, actor: &str, now_s: i64, nonce: [u8; 16]) -> String {
    let expiry = now_s + SESSION_LIFETIME.as_secs() as i64;
    let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let body = format!("{}.{expiry}.{nonce}.{}", role.as_str(), URL_SAFE_NO_PAD.encode(actor));
    let m = mac(key, "session", &body);
    format!("{body}.{m}")
}

/// The session `value` names, when its MAC checks out under `key` and it has not
/// expired at `now_s`.
pub fn verify(key: &[u8; 32], value: &str, now_s: i64) -> Option<Session> {
    let (body, given) = value.rsplit_once('.')?;
    let want = mac(key, "session", body);
    if !bool::from(want.as_bytes().ct_eq(given.as_bytes())) {
        return None;
    }
    let mut parts = body.split('.');
    let (role, expiry, nonce, actor) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || nonce.len() != 32 {
        return None;
    }
    let role = Role::parse(role)?;
    let expires_at: i64 = expiry.parse().ok()?;
    let actor = String::from_utf8(URL_SAFE_NO_PAD.decode(actor).ok()?).ok()?;
    // A session never ends later than a new one would (give or take a minute between
    // the clocks of several api processes): no cookie outlives its lifetime.
    let latest = now_s.saturating_add(SESSION_LIFETIME.as_secs() as i64 + 60);
    if now_s >= expires_at || expires_at > latest || !actor_ok(&actor) {
        return None;
    }
    Some(Session { role, actor, expires_at, nonce: nonce.to_owned(), cookie: value.to_owned() })
}

impl Session {
    /// The CSRF token of this session's forms.
    pub fn csrf(&self, key: &[u8; 32]) -> String {
        mac(key, "csrf", &self.cookie)
    }

    /// Whether `given` is this session's CSRF token (constant time).
    pub fn csrf_ok(&self, key: &[u8; 32], given: &str) -> bool {
        bool::from(self.csrf(key).as_bytes().ct_eq(given.as_bytes()))
    }
}

/// The value of cookie `name` in the `Cookie` headers given.
pub fn cookie_value<'a>(headers: impl Iterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    headers.flat_map(|h| h.split(';')).find_map(|pair| {
        let (n, v) = pair.trim().split_once('=')?;
        (n == name).then_some(v)
    })
}

/// The `Set-Cookie` of a session: `HttpOnly; SameSite=Strict; Path=/console`, and
/// `Secure` when the console is reached over https.
pub fn set_cookie(value: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE}={value}; Max-Age={}; Path=/console; HttpOnly; SameSite=Strict{secure}",
        SESSION_LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` that ends a session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}=; Max-Age=0; Path=/console; HttpOnly; SameSite=Strict{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tokens: &[&str], ops: &[&str]) -> [u8; 32] {
        key_under(&[42; 32], tokens, ops)
    }

    fn key_under(secret: &[u8; 32], tokens: &[&str], ops: &[&str]) -> [u8; 32] {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        session_key(secret, &v(tokens), &v(ops)).unwrap()
    }

    #[test]
    fn a_session_checks_out_until_it_expires_and_only_under_its_key() {
        let k = key(&["api-token-1"], &["op-token-1"]);
        let c = issue(&k, Role::Operator, "ana.b@x", 1_000, [7; 16]);
        let s = verify(&k, &c, 1_001).expect("valid");
        assert_eq!((s.role, s.actor.as_str()), (Role::Operator, "ana.b@x"));
        assert!(verify(&k, &c, 1_000 + SESSION_LIFETIME.as_secs() as i64).is_none(), "expired");
        assert!(verify(&k, &c, 999).is_some(), "issued a second ahead of this clock");
        assert!(verify(&k, &issue(&k, Role::Read, "a", 1_100, [7; 16]), 1_000).is_none(), "ends past its lifetime");
        assert!(verify(&key(&["api-token-2"], &["op-token-1"]), &c, 1_001).is_none(), "rotated tokens");
        assert_eq!(k, key(&["api-token-1"], &["op-token-1"]), "the same tokens give the same key");
        // Raising the role or changing any part breaks the MAC.
        let raised = c.replacen("operator", "read", 1);
        assert!(verify(&k, &raised, 1_001).is_none());
        let read = issue(&k, Role::Read, "bo", 1_000, [1; 16]);
        assert!(verify(&k, &read.replacen("read", "operator", 1), 1_001).is_none());
        assert!(verify(&k, "", 1_001).is_none());
        assert!(verify(&k, "operator.99999999999.x.YQ.mac", 1_001).is_none());
    }

    #[test]
    fn csrf_tokens_belong_to_one_session() {
        let k = key(&["api-token-1"], &[]);
        let a = verify(&k, &issue(&k, Role::Read, "a", 0, [1; 16]), 1).unwrap();
        let b = verify(&k, &issue(&k, Role::Read, "a", 0, [2; 16]), 1).unwrap();
        assert!(a.csrf_ok(&k, &a.csrf(&k)));
        assert!(!a.csrf_ok(&k, &b.csrf(&k)));
        assert!(!a.csrf_ok(&k, ""));
    }

    #[test]
    fn the_key_is_the_tokens_under_the_stores_secret() {
        let k = key(&["api-token-1"], &["op-token-1"]);
        assert_eq!(k, key(&["api-token-1"], &["op-token-1"]), "the same secret and tokens give the same key");
        let two = key(&["api-token-1", "api-token-2"], &["op-token-1"]);
        assert_eq!(two, key(&["api-token-2", "api-token-1"], &["op-token-1"]), "configured in another order");
        assert_ne!(k, key_under(&[43; 32], &["api-token-1"], &["op-token-1"]), "another store's secret");
        assert_ne!(k, key(&["api-token-1"], &["op-token-2"]), "a rotated operator token");
        assert_ne!(k, key(&["op-token-1"], &["api-token-1"]), "the lists are told apart");
        // A cookie names its nonce, which signing out ends.
        let c = issue(&k, Role::Read, "a", 0, [0xab; 16]);
        assert_eq!(verify(&k, &c, 1).unwrap().nonce, "ab".repeat(16));
    }

    #[test]
    fn no_token_no_key() {
        assert_eq!(session_key(&[1; 32], &[], &[]), None);
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = ["a=1; haul_console=x.y", "b=2"];
        assert_eq!(cookie_value(h.iter().copied(), COOKIE), Some("x.y"));
        assert_eq!(cookie_value(["haul_consolex=1"].iter().copied(), COOKIE), None);
        assert!(set_cookie("v", true).ends_with("HttpOnly; SameSite=Strict; Secure"));
        assert!(!clear_cookie(false).contains("Secure"));
    }
}
