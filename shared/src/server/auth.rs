//! Bearer-token authentication with roles, for every write route of both services.
//!
//! Tokens and their roles come from one environment variable, `AUTH_TOKENS`: a comma-separated
//! list of `role[+role...]:token`, e.g. `worker:Zq3...,producer+operator:Kd9...`. When it is
//! unset the service is open (the local stack runs so) and says so in a warning at start.
//!
//! Reads (`GET`) stay open: they change nothing and the dashboard and probes use them. Only the
//! SHA-256 digest of each token is kept, and a presented token is compared by digest, so the
//! comparison's timing tells nothing about a token and no token sits in memory to be dumped
//! into a log by a `Debug` print.

use std::collections::BTreeSet;
use std::fmt;

use actix_web::body::BoxBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;

use super::error::ApiError;

/// What a token may do. A route names the one role it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// lease-service: acquire, renew and release leases (applications, task-service, the
    /// generator).
    Leaseholder,
    /// task-service: claim, heartbeat, complete and fail tasks.
    Worker,
    /// task-service: create tasks.
    Producer,
    /// task-service: cancel tasks and start or stop the generator.
    Operator,
}

impl Role {
    pub const ALL: [Role; 4] = [
        Role::Leaseholder,
        Role::Worker,
        Role::Producer,
        Role::Operator,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Leaseholder => "leaseholder",
            Role::Worker => "worker",
            Role::Producer => "producer",
            Role::Operator => "operator",
        }
    }

    fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.name() == text)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The configured tokens, or none: then every route is open.
#[derive(Clone, Default)]
pub struct Auth {
    /// `None`: authentication is off. Each entry: a token's SHA-256 digest and its roles.
    tokens: Option<Vec<([u8; 32], BTreeSet<Role>)>>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tokens {
            None => f.write_str("Auth(off)"),
            Some(tokens) => write!(f, "Auth({} tokens)", tokens.len()),
        }
    }
}

/// Shortest token accepted: a guessable token is no lock.
pub const MIN_TOKEN_BYTES: usize = 16;

use super::sha256 as digest;

impl Auth {
    /// Every route open.
    pub fn open() -> Auth {
        Auth { tokens: None }
    }

    /// Parses `AUTH_TOKENS` (see the module's documentation). An empty or blank value means
    /// open. The error never quotes a token.
    pub fn parse(spec: &str) -> Result<Auth, String> {
        if spec.trim().is_empty() {
            return Ok(Auth::open());
        }
        let mut tokens: Vec<([u8; 32], BTreeSet<Role>)> = Vec::new();
        for (index, entry) in spec.split(',').enumerate() {
            let entry = entry.trim();
            let number = index + 1;
            let Some((roles, token)) = entry.split_once(':') else {
                return Err(format!(
                    "AUTH_TOKENS entry {number} is not role:token (roles: leaseholder, worker, producer, operator)"
                ));
            };
            if token.len() < MIN_TOKEN_BYTES {
                return Err(format!(
                    "AUTH_TOKENS entry {number}: the token must be at least {MIN_TOKEN_BYTES} bytes"
                ));
            }
            if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "AUTH_TOKENS entry {number}: the token must not contain spaces or control characters"
                ));
            }
            let mut set = BTreeSet::new();
            for name in roles.split('+') {
                let role = Role::parse(name.trim()).ok_or_else(|| {
                    format!(
                        "AUTH_TOKENS entry {number}: unknown role {:?} (roles: leaseholder, worker, producer, operator)",
                        name.trim()
                    )
                })?;
                set.insert(role);
            }
            let digest = digest(token);
            match tokens.iter_mut().find(|(known, _)| *known == digest) {
                Some((_, roles)) => roles.extend(set),
                None => tokens.push((digest, set)),
            }
        }
        Ok(Auth {
            tokens: Some(tokens),
        })
    }

    pub fn is_open(&self) -> bool {
        self.tokens.is_none()
    }

    /// Logs, once at start, whether the service's write routes are locked.
    pub fn announce(&self, service: &str) {
        match &self.tokens {
            None => tracing::warn!(
                "{service}: authentication is OFF: every write route is open to anyone who can reach it (set AUTH_TOKENS to lock them)"
            ),
            Some(tokens) => tracing::info!(
                tokens = tokens.len(),
                "{service}: write routes need a bearer token with the route's role"
            ),
        }
    }

    /// Whether `authorization` (the header's value, if any) carries a token with `role`.
    pub fn check(&self, authorization: Option<&str>, role: Role) -> Result<(), ApiError> {
        let Some(tokens) = &self.tokens else {
            return Ok(());
        };
        let Some(header) = authorization else {
            return Err(ApiError::Unauthorized(format!(
                "this route needs a bearer token with the {role} role (Authorization: Bearer <token>)"
            )));
        };
        let token = bearer_token(header)?;
        let presented = digest(token);
        let Some((_, roles)) = tokens.iter().find(|(known, _)| *known == presented) else {
            return Err(ApiError::Unauthorized(
                "the bearer token is not one this service knows".to_owned(),
            ));
        };
        if roles.contains(&role) {
            Ok(())
        } else {
            let held: Vec<&str> = roles.iter().map(|r| r.name()).collect();
            Err(ApiError::Forbidden(format!(
                "this route needs the {role} role; the token has {}",
                held.join(", ")
            )))
        }
    }
}

/// Locks one route: the request is refused (401 or 403, before its body is read) unless the
/// [`Auth`] in the app's data lets its bearer token act as `role`.
///
/// ```ignore
/// web::resource("").route(locked(web::post().to(create), Role::Producer))
/// ```
pub fn locked(route: actix_web::Route, role: Role) -> actix_web::Route {
    route.wrap(actix_web::middleware::from_fn(
        move |request, next: Next<BoxBody>| authorize(role, request, next),
    ))
}

async fn authorize(
    role: Role,
    request: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let verdict = match request.app_data::<web::Data<Auth>>() {
        Some(auth) => {
            let header = request
                .headers()
                .get(actix_web::http::header::AUTHORIZATION)
                .map(|value| value.to_str().unwrap_or("?"));
            auth.check(header, role)
        }
        // A service that forgot to install its Auth must not be silently open.
        None => Err(ApiError::Internal(
            "authentication is not configured on this route".to_owned(),
        )),
    };
    match verdict {
        Ok(()) => next.call(request).await,
        Err(refusal) => {
            let (request, _) = request.into_parts();
            let response = actix_web::ResponseError::error_response(&refusal);
            Ok(ServiceResponse::new(request, response))
        }
    }
}

/// The token of an `Authorization` header's value, which must be `Bearer <token>`.
pub fn bearer_token(authorization: &str) -> Result<&str, ApiError> {
    match authorization.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Ok(token.trim()),
        _ => Err(ApiError::Unauthorized(
            "the Authorization header must be \"Bearer <token>\"".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKER: &str = "worker-token-0123456789";
    const BOTH: &str = "producer-and-operator-0123";

    fn auth() -> Auth {
        Auth::parse(&format!("worker:{WORKER}, producer+operator:{BOTH}")).unwrap_or_default()
    }

    #[test]
    fn unset_or_blank_is_open_and_open_lets_everything_through() {
        for spec in ["", "  "] {
            let auth = Auth::parse(spec).unwrap_or_default();
            assert!(auth.is_open());
            assert!(auth.check(None, Role::Operator).is_ok());
        }
    }

    #[test]
    fn a_token_does_what_its_roles_allow_and_nothing_else() {
        let auth = auth();
        let bearer = |t: &str| format!("Bearer {t}");
        assert!(auth.check(Some(&bearer(WORKER)), Role::Worker).is_ok());
        assert!(auth.check(Some(&bearer(BOTH)), Role::Producer).is_ok());
        assert!(auth.check(Some(&bearer(BOTH)), Role::Operator).is_ok());
        let forbidden = auth.check(Some(&bearer(WORKER)), Role::Producer);
        assert!(
            matches!(forbidden, Err(ApiError::Forbidden(_))),
            "{forbidden:?}"
        );
        let forbidden = auth.check(Some(&bearer(BOTH)), Role::Worker);
        assert!(
            matches!(forbidden, Err(ApiError::Forbidden(_))),
            "{forbidden:?}"
        );
        for header in [
            None,
            Some("Bearer nope-nope-nope-nope"),
            Some(WORKER),
            Some("Basic abc"),
        ] {
            let refused = auth.check(header, Role::Worker);
            assert!(
                matches!(refused, Err(ApiError::Unauthorized(_))),
                "{header:?}: {refused:?}"
            );
        }
        assert!(
            auth.check(Some(&format!("bearer {WORKER}")), Role::Worker)
                .is_ok()
        );
    }

    #[test]
    fn bad_specs_are_refused_without_quoting_the_token() {
        for spec in [
            "worker",
            "boss:0123456789abcdefgh",
            "worker:short",
            "worker:has space 0123456789",
        ] {
            let err = Auth::parse(spec).err().unwrap_or_default();
            assert!(err.starts_with("AUTH_TOKENS entry 1"), "{spec}: {err}");
            assert!(!err.contains("0123456789"), "{err}");
        }
        assert!(!format!("{:?}", auth()).contains(WORKER));
    }
}
