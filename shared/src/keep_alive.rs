//! How long an idle HTTP connection between Leasehold's processes stays open, on both ends.
//!
//! A server closes an idle keep-alive connection after its timeout; a client that picks the same
//! connection from its pool at that moment sends a request into a closing socket and gets an
//! incomplete message, with no way to know whether the request was served. actix-web closes
//! after 5 s by default and reqwest keeps idle connections 90 s, so any pause of more than 5 s
//! between two calls could hit this. The rule that closes the race: every client drops an idle
//! connection well before any server would, so only the client ever closes an idle connection.

use std::time::Duration;

/// How long the services keep an idle client connection open.
pub const SERVER_IDLE: Duration = Duration::from_secs(75);

/// How long a client keeps an idle connection in its pool: well under [`SERVER_IDLE`], so a
/// pooled connection is never one the server is closing.
pub const CLIENT_IDLE: Duration = Duration::from_secs(30);

/// A reqwest client builder whose pool drops idle connections before the server does. Every
/// HTTP client of a Leasehold service starts from this.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_idle_timeout(CLIENT_IDLE)
}
