//! Integer fields of requests, read as JSON means them: JSON has one kind of number, so `3` and
//! `3.0` are the same value (and JSON Schema's `integer` admits both), while `3.5` is no
//! integer. serde alone refuses `3.0` for an `i64`; these read it. Use them with
//! `#[serde(deserialize_with = "...")]` (and `default` for an optional field).

use serde::de::{self, Deserializer, Visitor};

/// The largest float every integer below which is exact (2^53).
const EXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

struct Whole;

impl Visitor<'_> for Whole {
    type Value = i128;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<i128, E> {
        Ok(i128::from(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<i128, E> {
        Ok(i128::from(value))
    }

    #[allow(clippy::cast_possible_truncation)]
    fn visit_f64<E: de::Error>(self, value: f64) -> Result<i128, E> {
        // Only a float that is exactly an integer, and small enough that it names one integer
        // (above 2^53 a float stands for many): the cast is then exact.
        if value.fract() == 0.0 && value.abs() <= EXACT_FLOAT {
            Ok(value as i128)
        } else {
            Err(E::invalid_type(de::Unexpected::Float(value), &self))
        }
    }
}

fn in_range<T: TryFrom<i128>, E: de::Error>(value: i128) -> Result<T, E> {
    T::try_from(value).map_err(|_| {
        E::invalid_value(
            de::Unexpected::Other(&format!("the integer {value}")),
            &"an integer in range",
        )
    })
}

/// A required integer field.
pub fn integer<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<T, D::Error> {
    in_range(d.deserialize_any(Whole)?)
}

struct MaybeWhole;

impl<'de> Visitor<'de> for MaybeWhole {
    type Value = Option<i128>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an integer or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(Whole).map(Some)
    }
}

/// An optional integer field (`null` or absent: none). Pair it with `#[serde(default)]`.
pub fn optional<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Option<T>, D::Error> {
    d.deserialize_option(MaybeWhole)?.map(in_range).transpose()
}

/// One integer of a list.
struct Item(i128);

impl<'de> serde::Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Whole).map(Item)
    }
}

/// An optional list of integers. Pair it with `#[serde(default)]`.
pub fn optional_list<'de, D: Deserializer<'de>, T: TryFrom<i128>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    let items: Option<Vec<Item>> = serde::Deserialize::deserialize(d)?;
    items
        .map(|items| {
            items
                .into_iter()
                .map(|Item(value)| in_range(value))
                .collect()
        })
        .transpose()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[derive(Debug, serde::Deserialize)]
    struct Fields {
        #[serde(deserialize_with = "super::integer")]
        fence: i64,
        #[serde(default, deserialize_with = "super::optional")]
        ttl: Option<i32>,
    }

    fn read(json: &str) -> Result<Fields, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn an_integer_may_be_written_as_a_whole_float_and_nothing_else() {
        let fields = read(r#"{"fence": 3.0, "ttl": -2.0}"#).unwrap();
        assert_eq!((fields.fence, fields.ttl), (3, Some(-2)));
        assert_eq!(read(r#"{"fence": 7}"#).unwrap().ttl, None);
        assert_eq!(read(r#"{"fence": 7, "ttl": null}"#).unwrap().ttl, None);
        for bad in [
            r#"{"fence": 3.5}"#,
            r#"{"fence": "3"}"#,
            r#"{"fence": 1e300}"#,
            r#"{"fence": 9007199254740994.0}"#,
            r#"{"fence": 1, "ttl": 3000000000}"#,
            r#"{"fence": 18446744073709551615}"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
        assert_eq!(
            read(r#"{"fence": 9223372036854775807}"#).unwrap().fence,
            i64::MAX
        );
    }
}
