//! A service's routes, declared once: the list that mounts them is the list that documents them.
//!
//! Each handler carries its OpenAPI operation beside it (`#[utoipa::path]`: method, path,
//! parameters, body, answers). [`routes!`](crate::routes) turns one list of handlers, each with
//! the role its writes need, into a [`Routes`]: the OpenAPI document of exactly those handlers,
//! and the actix routes that serve them at the method and path their operations name. So a
//! route cannot be served undocumented, nor documented unserved, nor served at another path
//! than its document says; and what every route shares (the bearer scheme and the role a write
//! needs, the refusals of the front door and of the extractors) is added here, once, from the
//! same facts that mount it.

use std::collections::BTreeMap;

use actix_web::http::Method;
use actix_web::web;
use utoipa::openapi::path::HttpMethod;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{OpenApi, RefOr};

mod answers;

use super::ApiError;
use super::auth::{Role, locked};
use super::http::with_body_limit;
use crate::api::ErrorBody;
use answers::{add_answers, locate, operations, operations_mut};

/// Where each service serves its document and its reference page.
pub const OPENAPI_PATH: &str = "/api/openapi.json";
pub const DOCS_PATH: &str = "/api/docs";

/// The name of the bearer-token scheme in the documents' components.
const BEARER: &str = "bearer";

/// One handler's route: the operation its `#[utoipa::path]` wrote (found by its id, the
/// handler's name) and the role a request needs, if any.
#[derive(Debug)]
pub struct Endpoint {
    pub id: &'static str,
    pub role: Option<Role>,
    /// Builds the actix route for a method (called once per server worker).
    route: fn(Method) -> actix_web::Route,
}

impl Endpoint {
    pub fn new(
        id: &'static str,
        role: Option<Role>,
        route: fn(Method) -> actix_web::Route,
    ) -> Self {
        Endpoint { id, role, route }
    }
}

/// A service's routes and their document. Build it with [`routes!`](crate::routes).
pub struct Routes {
    document: OpenApi,
    /// In the order listed: actix tries resources in the order they were mounted, so a path
    /// with a fixed segment (`/api/tasks/retry`) must come before one with a parameter there
    /// (`/api/tasks/{id}`).
    endpoints: Vec<(String, Method, Endpoint)>,
    /// Paths whose bodies may be larger than the service's limit, and their own limit.
    body_limits: BTreeMap<String, usize>,
    /// Whether the service runs with `AUTH_TOKENS`: only then does its document ask for a
    /// token, and answer 401 and 403 `forbidden`.
    locked: bool,
}

impl Routes {
    /// `document` holds the operations of `endpoints` (as `#[derive(OpenApi)]` collects them
    /// from the handlers); each endpoint is served at its operation's method and path.
    ///
    /// # Panics
    /// When an endpoint has no operation in the document, or one at several methods: a
    /// mistake in the service's list that its first test (or start) shows.
    pub fn new(mut document: OpenApi, mut endpoints: Vec<Endpoint>) -> Self {
        // Every service serves its document and its reference page, documented as any route.
        document.paths.add_path_operation(
            OPENAPI_PATH,
            vec![HttpMethod::Get],
            <__path_openapi_json as utoipa::Path>::operation(),
        );
        document.paths.add_path_operation(
            "/healthz",
            vec![HttpMethod::Get],
            <super::http::__path_healthz as utoipa::Path>::operation(),
        );
        document.paths.add_path_operation(
            DOCS_PATH,
            vec![HttpMethod::Get],
            <__path_api_docs as utoipa::Path>::operation(),
        );
        endpoints.push(Endpoint::new("openapi_json", None, |method| {
            web::method(method).to(openapi_json)
        }));
        endpoints.push(Endpoint::new("healthz", None, |method| {
            web::method(method).to(super::http::healthz)
        }));
        endpoints.push(Endpoint::new("api_docs", None, |method| {
            web::method(method).to(api_docs)
        }));
        let mut located = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let (path, method) = locate(&document, endpoint.id)
                .unwrap_or_else(|| panic!("{}: no operation of that id", endpoint.id));
            located.push((path, method, endpoint));
        }
        Routes {
            document,
            endpoints: located,
            body_limits: BTreeMap::new(),
            locked: true,
        }
    }

    /// Documents the routes as the service runs them: with `auth` open (no `AUTH_TOKENS`), no
    /// route asks for a bearer token, nor answers 401 or 403 `forbidden`; a client generated
    /// from the document, or a fuzzer reading it, sees the service it talks to.
    pub fn with_auth(mut self, auth: &super::auth::Auth) -> Self {
        self.locked = !auth.is_open();
        self
    }

    /// Bounds `field` of component `schema` to `min..=max`: a bound the service takes from its
    /// configuration (lease-service's TTLs), so that its document states the running one.
    ///
    /// # Panics
    /// When the schema has no such field: a mistake of the caller that its first test shows.
    pub fn bound(mut self, schema: &str, field: &str, min: i64, max: i64) -> Self {
        use utoipa::openapi::schema::Schema;
        let property = self
            .document
            .components
            .as_mut()
            .and_then(|components| components.schemas.get_mut(schema))
            .and_then(|schema| match schema {
                RefOr::T(Schema::Object(object)) => object.properties.get_mut(field),
                _ => None,
            });
        match property {
            Some(RefOr::T(Schema::Object(property))) => {
                property.minimum = Some(min.into());
                property.maximum = Some(max.into());
            }
            _ => panic!("{schema}.{field}: no such field to bound"),
        }
        self
    }

    /// Bodies of `path` may be up to `bytes` (where the service's own limit is lower).
    pub fn body_limit(mut self, path: &str, bytes: usize) -> Self {
        self.body_limits.insert(path.to_owned(), bytes);
        self
    }

    /// Mounts every route: one actix resource per path, in the order listed, which answers
    /// 405 `method_not_allowed` to any method its operations do not name.
    pub fn mount(&self, cfg: &mut web::ServiceConfig) {
        let json: std::sync::Arc<str> = self
            .document()
            .to_json()
            .unwrap_or_else(|err| panic!("the OpenAPI document as JSON: {err}"))
            .into();
        let mut paths: Vec<&str> = Vec::new();
        for (path, _, _) in &self.endpoints {
            if !paths.contains(&path.as_str()) {
                paths.push(path);
            }
        }
        for path in paths {
            let mut resource = web::resource(self.actix_pattern(path));
            let mut allow = Vec::new();
            for (_, method, endpoint) in self.endpoints.iter().filter(|(p, _, _)| p == path) {
                allow.push(method.to_string());
                let route = (endpoint.route)(method.clone());
                resource = resource.route(match endpoint.role {
                    Some(role) => locked(route, role),
                    None => route,
                });
            }
            let allow = allow.join(", ");
            resource = resource.default_service(web::to(move || {
                let allow = allow.clone();
                async move { method_not_allowed(&allow) }
            }));
            if path == OPENAPI_PATH {
                resource = resource.app_data(web::Data::new(Document(json.clone())));
            }
            if let Some(&bytes) = self.body_limits.get(path) {
                resource = with_body_limit(resource, bytes);
            }
            cfg.service(resource);
        }
    }

    /// Narrows `field` of the request body of operation `id` to `values`: one body type read
    /// by several routes, each taking its own subset of a field's values (task-service's bulk
    /// operations and their statuses). The body's schema is copied inline for that route.
    ///
    /// # Panics
    /// When the operation has no JSON body referring to a component with that field.
    pub fn narrow(mut self, id: &str, field: &str, values: &[&str]) -> Self {
        use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
        let components = self.document.components.as_ref();
        let operation = self
            .document
            .paths
            .paths
            .values_mut()
            .flat_map(operations_mut)
            .find(|operation| operation.operation_id.as_deref() == Some(id));
        let content = operation
            .and_then(|operation| operation.request_body.as_mut())
            .and_then(|body| match body {
                RefOr::T(body) => body.content.get_mut("application/json"),
                RefOr::Ref(_) => None,
            });
        let Some(RefOr::T(content)) = content else {
            panic!("{id}: no JSON request body to narrow");
        };
        let mut body = match &content.schema {
            Some(RefOr::Ref(reference)) => {
                let name = reference
                    .ref_location
                    .rsplit('/')
                    .next()
                    .unwrap_or_default();
                match components.and_then(|components| components.schemas.get(name)) {
                    Some(RefOr::T(Schema::Object(object))) => object.clone(),
                    _ => panic!("{id}: {name} is not an object schema"),
                }
            }
            _ => panic!("{id}: its body is not a component"),
        };
        let narrowed = ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                Type::String,
                Type::Null,
            ]))
            .enum_values(Some(values.iter().map(|value| Some(*value)).chain([None])))
            .build();
        body.properties
            .insert(field.to_owned(), RefOr::T(Schema::Object(narrowed)));
        content.schema = Some(RefOr::T(Schema::Object(body)));
        self
    }

    /// The actix pattern of a documented path: the same `{name}` segments, each bounded by the
    /// `pattern` its parameter's schema states (anchors dropped) when that pattern routes (the
    /// dashboard's views, a task's digits): so what the document says a parameter matches is
    /// what the route matches. A pattern with escapes or look-around is a name's rule, which the
    /// handler checks (and answers with a JSON 400), not the router.
    fn actix_pattern(&self, path: &str) -> String {
        let Some(item) = self.document.paths.paths.get(path) else {
            return path.to_owned();
        };
        let parameters: Vec<&utoipa::openapi::path::Parameter> = operations(item)
            .into_iter()
            .flat_map(|(_, operation)| operation.parameters.iter().flatten())
            .filter_map(|parameter| match parameter {
                RefOr::T(parameter) => Some(parameter),
                RefOr::Ref(_) => None,
            })
            .filter(|parameter| parameter.parameter_in == utoipa::openapi::path::ParameterIn::Path)
            .collect();
        path.split('/')
            .map(|segment| {
                let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
                    return segment.to_owned();
                };
                let pattern = parameters
                    .iter()
                    .find(|parameter| parameter.name == name)
                    .and_then(|parameter| match &parameter.schema {
                        Some(RefOr::T(utoipa::openapi::schema::Schema::Object(object))) => object
                            .pattern
                            .clone()
                            .filter(|p| !p.contains('\\') && !p.contains("(?")),
                        _ => None,
                    });
                match pattern {
                    Some(pattern) => format!(
                        "{{{name}:{}}}",
                        pattern.trim_start_matches('^').trim_end_matches('$')
                    ),
                    None => segment.to_owned(),
                }
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// The OpenAPI document of these routes, with what every route shares.
    pub fn document(&self) -> OpenApi {
        let mut document = self.document.clone();
        self.add_shared_answers(&mut document);
        document
    }

    /// What every route shares, written into its operation: the bearer token and the role a
    /// locked route needs, with its 401 and 403; the refusals of a body the route cannot read;
    /// and the 503 of a dependency down and the 500 of a bug, which any route may give.
    fn add_shared_answers(&self, document: &mut OpenApi) {
        let roles: BTreeMap<String, Option<Role>> = self
            .endpoints
            .iter()
            .map(|(_, _, endpoint)| (endpoint.id.to_owned(), endpoint.role))
            .collect();
        let mut components = document.components.take().unwrap_or_default();
        // The schemas of what every service serves besides its own routes.
        let mut shared = Vec::new();
        <super::http::__path_healthz as utoipa::__dev::SchemaReferences>::schemas(&mut shared);
        <ErrorBody as utoipa::ToSchema>::schemas(&mut shared);
        shared.push((
            <ErrorBody as utoipa::ToSchema>::name().into_owned(),
            <ErrorBody as utoipa::PartialSchema>::schema(),
        ));
        for (name, schema) in shared {
            components.schemas.entry(name).or_insert(schema);
        }
        if self.locked {
            components.security_schemes.insert(
                BEARER.to_owned(),
                RefOr::T(SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer))),
            );
        }
        document.components = Some(components);
        for item in document.paths.paths.values_mut() {
            for operation in operations_mut(item) {
                let id = operation.operation_id.clone().unwrap_or_default();
                let role = roles.get(&id).copied().flatten();
                add_answers(operation, role, self.locked);
            }
        }
    }
}

/// 405 `method_not_allowed`, with the methods the path does take in `Allow` (RFC 9110).
fn method_not_allowed(allow: &str) -> actix_web::HttpResponse {
    let mut response = actix_web::ResponseError::error_response(&ApiError::MethodNotAllowed);
    if let Ok(value) = actix_web::http::header::HeaderValue::from_str(allow) {
        response
            .headers_mut()
            .insert(actix_web::http::header::ALLOW, value);
    }
    response
}

/// The document as JSON, for [`openapi_json`].
#[derive(Debug, Clone)]
struct Document(std::sync::Arc<str>);

/// This service's OpenAPI document: every route it serves, generated from the code that serves
/// them.
#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "reference",
    responses((
        status = 200,
        description = "The OpenAPI 3.1 document of this service",
        content_type = "application/json",
        body = Object
    ))
)]
async fn openapi_json(document: web::Data<Document>) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("application/json")
        .body(document.0.to_string())
}

/// The reference page of this service's API, drawn from its OpenAPI document by a script of
/// its own (no CDN: it works offline).
#[utoipa::path(
    get,
    path = "/api/docs",
    tag = "reference",
    responses((status = 200, description = "The API reference page", content_type = "text/html", body = String))
)]
async fn api_docs() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(include_str!("docs.html"))
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field(
                "endpoints",
                &self
                    .endpoints
                    .iter()
                    .map(|(path, method, endpoint)| format!("{method} {path} ({})", endpoint.id))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The operation id `#[utoipa::path]` gives a handler: its function's name, the last segment of
/// the path the list names it by.
#[doc(hidden)]
pub fn operation_id(handler: &'static str) -> &'static str {
    handler.rsplit("::").next().unwrap_or(handler).trim()
}

/// Declares a service's routes once: `routes!(fn name; handler [Role::X], other, ...)` defines
/// `fn name() -> Routes` whose document holds the listed handlers' operations (collected by
/// `#[derive(utoipa::OpenApi)]`, with every schema they name) and whose
/// [`Routes::mount`] serves each at its operation's method and path, locked to its role when
/// one is given. List a path with a fixed segment before a path with a parameter in its place.
#[macro_export]
macro_rules! routes {
    ($vis:vis fn $name:ident; $($handler:path $([$role:expr])?),* $(,)?) => {
        $vis fn $name() -> $crate::server::routes::Routes {
            #[derive(utoipa::OpenApi)]
            #[openapi(paths($($handler),*))]
            struct Document;
            $crate::server::routes::Routes::new(
                <Document as utoipa::OpenApi>::openapi(),
                vec![$(
                    $crate::server::routes::Endpoint::new(
                        $crate::server::routes::operation_id(stringify!($handler)),
                        {
                            #[allow(unused_mut)]
                            let mut role: Option<$crate::server::auth::Role> = None;
                            $(role = Some($role);)?
                            role
                        },
                        |method| actix_web::web::method(method).to($handler),
                    )
                ),*],
            )
        }
    };
}
