//! What the OpenAPI document says of every route besides its own operation: the answers every
//! route shares (401/403 with the role, the body's refusals, 500/503, `Retry-After`), the paging
//! headers, and finding an operation by id.

use actix_web::http::Method;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{Content, OpenApi, PathItem, Ref, RefOr, ResponseBuilder, ResponsesBuilder};

use super::BEARER;
use crate::server::auth::Role;

/// The method and path of the operation `id` in `document`.
pub(super) fn locate(document: &OpenApi, id: &str) -> Option<(String, Method)> {
    let mut found = Vec::new();
    for (path, item) in &document.paths.paths {
        for (method, operation) in operations(item) {
            if operation.operation_id.as_deref() == Some(id) {
                found.push((path.clone(), method));
            }
        }
    }
    match found.as_slice() {
        [(path, method)] => Some((path.clone(), method.clone())),
        _ => None,
    }
}

pub(super) fn operations(item: &PathItem) -> Vec<(Method, &Operation)> {
    [
        (Method::GET, &item.get),
        (Method::PUT, &item.put),
        (Method::POST, &item.post),
        (Method::DELETE, &item.delete),
        (Method::PATCH, &item.patch),
        (Method::HEAD, &item.head),
        (Method::OPTIONS, &item.options),
    ]
    .into_iter()
    .filter_map(|(method, operation)| Some((method, operation.as_ref()?)))
    .collect()
}

pub(super) fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
        &mut item.head,
        &mut item.options,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// An error answer: the shared `ErrorBody` schema, with what may cause it.
pub(super) fn error_answer(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                Content::new(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody")))),
            )
            .build(),
    )
}

/// The header `ApiError` answers a status with (`error_response`), on every answer of that
/// status, the route's own included.
pub(super) fn add_error_header(status: &str, answer: &mut RefOr<utoipa::openapi::Response>) {
    use utoipa::openapi::HeaderBuilder;
    use utoipa::openapi::schema::Object;
    let RefOr::T(answer) = answer else {
        return;
    };
    let header = match status {
        "401" => Some((
            "WWW-Authenticate",
            Object::with_type(utoipa::openapi::Type::String),
            "`Bearer realm=\"leasehold\"`: the scheme the token goes in",
        )),
        "503" => Some((
            "Retry-After",
            Object::with_type(utoipa::openapi::Type::Integer),
            "Seconds to wait before trying again",
        )),
        _ => None,
    };
    if let Some((name, schema, description)) = header {
        answer.headers.entry(name.to_owned()).or_insert_with(|| {
            HeaderBuilder::new()
                .schema(Some(schema))
                .description(Some(description))
                .build()
                .into()
        });
    }
}

/// A listing's page carries the next page's address in headers too (see
/// [`super::paging::Page::respond`]): every route that takes a `cursor` says so.
pub(super) fn add_paging_headers(operation: &mut Operation) {
    use utoipa::openapi::HeaderBuilder;
    let pages =
        operation.parameters.iter().flatten().any(
            |parameter| matches!(parameter, RefOr::T(parameter) if parameter.name == "cursor"),
        );
    let Some(RefOr::T(page)) = operation.responses.responses.get_mut("200") else {
        return;
    };
    if !pages {
        return;
    }
    let text = || {
        Some(utoipa::openapi::schema::Object::with_type(
            utoipa::openapi::Type::String,
        ))
    };
    page.headers.insert(
        "X-Next-Cursor".to_owned(),
        HeaderBuilder::new()
            .schema(text())
            .description(Some("The next page's `cursor`, when there is a next page"))
            .build()
            .into(),
    );
    page.headers.insert(
        "Link".to_owned(),
        HeaderBuilder::new()
            .schema(text())
            .description(Some(
                "`<...>; rel=\"next\"`: the next page's address, when there is one",
            ))
            .build()
            .into(),
    );
}

/// Adds the answers every route shares to `operation`, served to `role` (a write) or to anyone
/// (a read); `locked`: the service checks bearer tokens.
pub(super) fn add_answers(operation: &mut Operation, role: Option<Role>, locked: bool) {
    add_paging_headers(operation);
    let mut answers: Vec<(&str, String)> = Vec::new();
    match role {
        Some(role) if locked => {
            operation.security = Some(vec![SecurityRequirement::new(BEARER, [role.name()])]);
            answers.push((
                "401",
                "`unauthorized`: no bearer token, a malformed one, or one the service does not \
                 know (with `WWW-Authenticate: Bearer`)"
                    .to_owned(),
            ));
            answers.push((
                "403",
                format!(
                    "`forbidden`: a token without the `{}` role; `origin_not_allowed`: a \
                     browser's write from an origin `CORS_ALLOWED_ORIGINS` does not name",
                    role.name()
                ),
            ));
        }
        Some(_) => answers.push((
            "403",
            "`origin_not_allowed`: a browser's write from an origin `CORS_ALLOWED_ORIGINS` does \
             not name"
                .to_owned(),
        )),
        None => {}
    }
    let has_body = operation.request_body.is_some();
    let has_parameters = operation
        .parameters
        .as_ref()
        .is_some_and(|parameters| !parameters.is_empty());
    let mut invalid = Vec::new();
    if has_body {
        invalid.push(
            "`malformed_json`: a body that is not JSON; `invalid_field`, `missing_field`: a body \
             not of the route's shape (an array where an object is read, a field missing or of \
             another type)",
        );
    }
    if has_parameters {
        invalid.push("`invalid_query`, `invalid_id`: a query or path parameter not of its type");
    }
    if !invalid.is_empty() {
        answers.push((
            "400",
            format!(
                "{}; and the route's own codes for a field out of its bounds (`field` names it)",
                invalid.join("; ")
            ),
        ));
    }
    if has_body {
        answers.push((
            "408",
            "`request_timeout`: the body did not arrive in time".to_owned(),
        ));
        answers.push((
            "413",
            "`payload_too_large`: a body over the route's limit".to_owned(),
        ));
        answers.push((
            "415",
            "`unsupported_media_type`: a body without `Content-Type: application/json`".to_owned(),
        ));
    }
    answers.push(("500", "`internal`: a fault of the service's own".to_owned()));
    answers.push((
        "503",
        "`unavailable`: the database (or a service this one calls) cannot be reached or took \
         too long; retrying later may work"
            .to_owned(),
    ));
    let mut responses = std::mem::take(&mut operation.responses).responses;
    for (status, description) in answers {
        responses
            .entry(status.to_owned())
            .or_insert_with(|| error_answer(&description));
    }
    for (status, answer) in &mut responses {
        add_error_header(status, answer);
    }
    let mut sorted: Vec<_> = responses.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    operation.responses = sorted
        .into_iter()
        .fold(ResponsesBuilder::new(), |builder, (status, response)| {
            builder.response(status, response)
        })
        .build();
}
