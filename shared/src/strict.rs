//! Reading a request body as its document describes it: a JSON object wherever a struct is
//! expected, at any depth.
//!
//! serde also reads a struct from a JSON array of its fields in declaration order, so
//! `[null, null]` was accepted as a body whose fields are all optional, and `["a", 30]` as a
//! lease acquisition. No document of ours allows that, no client sends it, and a body that
//! means something only by the order of fields in a Rust struct would break the day a field is
//! added; Schemathesis's negative-data check sent such bodies and was answered 200. [`Strict`]
//! wraps a deserializer so that every struct under it is read from an object only; all else is
//! read as before. What it does not reach: a struct read back from serde's internal buffer (an
//! internally tagged, untagged or flattened part), which no request body of ours has.

use std::fmt;

use serde::Deserialize;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

/// `T`, read strictly from whatever deserializer reads this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strict<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Strict<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(Wrap(deserializer)).map(Strict)
    }
}

/// [`serde_json::from_slice`], strictly.
pub fn from_slice<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> serde_json::Result<T> {
    serde_json::from_slice::<Strict<T>>(bytes).map(|strict| strict.0)
}

/// [`serde_json::from_value`], strictly.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> serde_json::Result<T> {
    T::deserialize(Wrap(value))
}

/// The one wrapper: around a deserializer it reads structs from maps only; around a visitor,
/// a sequence, a map, a seed or an enum, it passes itself on to what they read next.
struct Wrap<X>(X);

macro_rules! forward_deserialize {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(Wrap(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Wrap<D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, Wrap(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, Wrap(visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, Wrap(visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple_struct(name, len, Wrap(visitor))
    }

    /// The point of it all: a struct is read as a map, which a JSON array is not.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_map(Wrap(visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, Wrap(visitor))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty))*) => {$(
        fn $method<E: serde::de::Error>(self, value: $ty) -> Result<V::Value, E> {
            self.0.$method(value)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(formatter)
    }

    forward_visit! {
        visit_bool(bool) visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64)
        visit_i128(i128) visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64)
        visit_u128(u128) visit_f32(f32) visit_f64(f64) visit_char(char) visit_str(&str)
        visit_borrowed_str(&'de str) visit_string(String) visit_bytes(&[u8])
        visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Wrap(deserializer))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(Wrap(deserializer))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(Wrap(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(Wrap(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.0.visit_enum(Wrap(data))
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Wrap<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Wrap(deserializer))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Wrap(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(Wrap(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        self.0.next_value_seed(Wrap(seed))
    }

    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Wrap<A> {
    type Error = A::Error;
    type Variant = Wrap<A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        self.0
            .variant_seed(Wrap(seed))
            .map(|(value, variant)| (value, Wrap(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Wrap<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Wrap(seed))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, Wrap(visitor))
    }

    /// A struct variant's fields, read as a map like any struct's: its content is read as one
    /// value, by a seed that asks for a map.
    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.newtype_variant_seed(AsMap(visitor))
    }
}

/// A seed that reads a struct variant's content as a map.
struct AsMap<V>(V);

impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for AsMap<V> {
    type Value = V::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        deserializer.deserialize_map(Wrap(self.0))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde::Deserialize;
    use serde_json::json;

    use super::{from_slice, from_value};

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        name: String,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        ttl: Option<i64>,
        inner: Option<Inner>,
        #[serde(default)]
        items: Vec<Inner>,
        shape: Option<Shape>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum Shape {
        Dot,
        Line(i64),
        Box { side: i64 },
    }

    #[test]
    fn objects_are_read_as_before() {
        let body = br#"{"ttl": 3, "inner": {"name": "a"}, "items": [{"name": "b"}],
                        "shape": {"box": {"side": 2}}}"#;
        let outer: Outer = from_slice(body).unwrap();
        assert_eq!(outer.ttl, Some(3));
        assert_eq!(outer.inner, Some(Inner { name: "a".into() }));
        assert_eq!(outer.items, vec![Inner { name: "b".into() }]);
        assert_eq!(outer.shape, Some(Shape::Box { side: 2 }));
        let dot: Outer = from_slice(br#"{"shape": "dot"}"#).unwrap();
        assert_eq!(dot.shape, Some(Shape::Dot));
        let line: Outer = from_value(json!({"shape": {"line": 4}})).unwrap();
        assert_eq!(line.shape, Some(Shape::Line(4)));
    }

    #[test]
    fn a_struct_is_never_read_from_an_array_at_any_depth() {
        // What plain serde_json accepts, and strict reading refuses.
        let cases = [
            json!([null, null, [], null]),
            json!({"inner": ["a"]}),
            json!({"items": [["b"]]}),
            json!({"shape": {"box": [2]}}),
        ];
        for case in cases {
            let bytes = serde_json::to_vec(&case).unwrap();
            let plain: Result<Outer, _> = serde_json::from_slice(&bytes);
            assert!(plain.is_ok(), "serde_json alone reads {case}");
            let error = from_slice::<Outer>(&bytes).unwrap_err();
            assert!(error.is_data(), "{case}: {error}");
            assert!(from_value::<Outer>(case.clone()).is_err(), "{case}");
        }
    }
}
