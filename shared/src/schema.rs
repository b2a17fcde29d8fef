//! Schemas for the API documents of what the wire types hold but their Rust types do not say:
//! names and their bounds, and JSON that PostgreSQL can store. Each states exactly what the
//! services accept, so that a client (or a fuzzer) that follows the document is never refused.

use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, Object, ObjectBuilder, Schema, Type,
};
use utoipa::openapi::{Ref, RefOr};

// The bounds of names and batches: stated here, below the wire types that hold them and
// re-exported there, so that the schemas and the types read one number.

/// Longest `resource` or `holder` accepted, in characters.
pub const MAX_NAME_CHARS: usize = 512;

/// Most resources one `POST /api/leases/batch` may acquire.
pub const MAX_BATCH_RESOURCES: usize = 100;

/// Longest queue name task-service accepts, in characters. The worker checks its `WORKER_QUEUE`
/// against it at startup, so a bad setting fails there rather than on every claim.
pub const MAX_QUEUE_CHARS: usize = 128;

/// Longest idempotency or concurrency key, in characters.
pub const MAX_KEY_CHARS: usize = 255;

/// Longest host or version a worker process may give of itself (`WorkerInfo`), in characters.
/// What a process says is kept as its liveness lease's metadata, which lease-service bounds
/// in bytes (`MAX_LEASE_METADATA_BYTES`): at this bound, a beat with every field at its longest
/// (each character four bytes of UTF-8) still fits, with the id and queue at theirs.
pub const MAX_WORKER_LABEL_CHARS: usize = 160;

/// Longest schedule name, in characters.
pub const MAX_SCHEDULE_NAME_CHARS: usize = 200;

/// What is wrong with `value` as a name of at most `max_chars` characters, in words that follow
/// the name's field (`"queue must not be empty"`); `None` when nothing is. The one rule for
/// names, which the services check requests by and the worker checks its settings by, so that
/// a setting the worker accepts is never refused on the wire: 1 to `max_chars` characters
/// (Unicode scalar values, as JSON Schema's `maxLength` counts them), none a control character
/// (PostgreSQL text cannot hold NUL, and line breaks in names only confuse logs).
pub fn name_problem(value: &str, max_chars: usize) -> Option<String> {
    let chars = value.chars().count();
    if value.is_empty() {
        Some("must not be empty".to_owned())
    } else if chars > max_chars {
        Some(format!(
            "must be at most {max_chars} characters, got {chars}"
        ))
    } else if value.chars().any(char::is_control) {
        Some("must not contain control characters".to_owned())
    } else {
        None
    }
}

/// A name holds no control character (Unicode's `Cc`, what `char::is_control` finds).
pub const NAME_PATTERN: &str = r"^[^\u0000-\u001F\u007F-\u009F]*$";

/// Text that PostgreSQL can store: no NUL.
const NO_NUL: &str = r"^[^\u0000]*$";

fn text(min: Option<usize>, max: Option<usize>, pattern: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(min)
        .max_length(max)
        .pattern(Some(pattern))
        .build()
}

macro_rules! name_schema {
    ($name:ident, $max:expr, $about:literal) => {
        #[doc = $about]
        #[derive(Debug)]
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                let mut schema = text(Some(1), Some($max), NAME_PATTERN);
                schema.description = Some(format!(
                    "{}: 1 to {} characters, none of them a control character",
                    $about.trim_end_matches('.'),
                    $max
                ));
                RefOr::T(Schema::Object(schema))
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

name_schema!(
    Name,
    MAX_NAME_CHARS,
    "A name: a resource, a holder, a processor."
);
name_schema!(QueueName, MAX_QUEUE_CHARS, "A queue's name.");
name_schema!(
    Key,
    MAX_KEY_CHARS,
    "A key: an idempotency key, a concurrency key."
);
name_schema!(
    WorkerLabel,
    MAX_WORKER_LABEL_CHARS,
    "A worker process's host or version."
);
name_schema!(ScheduleName, MAX_SCHEDULE_NAME_CHARS, "A schedule's name.");

/// A JSON object: task data and outputs, lease metadata. PostgreSQL's `jsonb` cannot hold a
/// NUL character, so none may appear in a key or a string at any depth; the schema states it
/// for the object's own keys only, since a schema that says it at every depth must refer to
/// itself inside a union, which generators of clients in other languages (openapi-python-client)
/// cannot read.
#[derive(Debug)]
pub struct JsonObject;

impl utoipa::PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property_names(Some(text(None, None, NO_NUL)))
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .build();
        object.description =
            Some("A JSON object; no NUL character in any key or string, at any depth".to_owned());
        RefOr::T(Schema::Object(object))
    }
}

impl utoipa::ToSchema for JsonObject {}

/// `POST /api/leases/batch`'s `resources`: 1 to 100 names, each once.
pub fn resources_once() -> utoipa::openapi::schema::Array {
    let mut array = ArrayBuilder::new()
        .items(RefOr::Ref(Ref::from_schema_name("Name")))
        .min_items(Some(1))
        .max_items(Some(MAX_BATCH_RESOURCES))
        .build();
    array.unique_items = true;
    array
}
