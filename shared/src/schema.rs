//! Schemas for the API documents of what the wire types hold but their Rust types do not say:
//! names and their bounds, and JSON that PostgreSQL can store. Each states exactly what the
//! services accept, so that a client (or a fuzzer) that follows the document is never refused.

use utoipa::openapi::schema::{
    AdditionalProperties, AnyOfBuilder, ArrayBuilder, Object, ObjectBuilder, Schema, Type,
};
use utoipa::openapi::{Ref, RefOr};

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
    crate::api::MAX_NAME_CHARS,
    "A name: a resource, a holder, a processor."
);
name_schema!(QueueName, crate::tasks::MAX_QUEUE_CHARS, "A queue's name.");
name_schema!(
    Key,
    crate::tasks::MAX_KEY_CHARS,
    "A key: an idempotency key, a concurrency key."
);
name_schema!(
    ScheduleName,
    crate::schedules::MAX_SCHEDULE_NAME_CHARS,
    "A schedule's name."
);

/// Any JSON value without a NUL in a string or a key (PostgreSQL's `jsonb` cannot hold one).
#[derive(Debug)]
pub struct JsonValue;

fn json_value_ref() -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name("JsonValue"))
}

fn object_of_json() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(text(None, None, NO_NUL)))
        .additional_properties(Some(AdditionalProperties::RefOr(json_value_ref())))
        .build()
}

impl utoipa::PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        let string = text(None, None, NO_NUL);
        RefOr::T(Schema::AnyOf(
            AnyOfBuilder::new()
                .description(Some("Any JSON value without a NUL character"))
                .item(string)
                .item(ObjectBuilder::new().schema_type(Type::Number))
                .item(ObjectBuilder::new().schema_type(Type::Boolean))
                .item(ObjectBuilder::new().schema_type(Type::Null))
                .item(ArrayBuilder::new().items(json_value_ref()))
                .item(object_of_json())
                .build(),
        ))
    }
}

impl utoipa::ToSchema for JsonValue {}

/// A JSON object without a NUL in any string or key: task data and outputs, lease metadata.
#[derive(Debug)]
pub struct JsonObject;

impl utoipa::PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        let mut object = object_of_json();
        object.description = Some("A JSON object without a NUL character".to_owned());
        RefOr::T(Schema::Object(object))
    }
}

impl utoipa::ToSchema for JsonObject {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            "JsonValue".to_owned(),
            <JsonValue as utoipa::PartialSchema>::schema(),
        ));
    }
}

/// `POST /api/leases/batch`'s `resources`: 1 to 100 names, each once.
pub fn resources_once() -> utoipa::openapi::schema::Array {
    let mut array = ArrayBuilder::new()
        .items(RefOr::Ref(Ref::from_schema_name("Name")))
        .min_items(Some(1))
        .max_items(Some(crate::api::MAX_BATCH_RESOURCES))
        .build();
    array.unique_items = true;
    array
}
