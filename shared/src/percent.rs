//! Percent-encoding of one URL component: a path segment the clients put a name in (a queue),
//! or a query value of a listing's next-page link. Everything but RFC 3986's unreserved
//! characters is encoded, so a name can never change the path or the query around it.

/// `value` with every byte outside `A-Z a-z 0-9 - _ . ~` written as `%XX`.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The value [`encode`] was given: `%XX` decoded, anything else kept as it is. `None` when a
/// `%` is not followed by two hexadecimal digits, or the bytes are not UTF-8.
pub fn decode(encoded: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut rest = encoded.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(encode("a b/é"), "a%20b%2F%C3%A9");
        assert_eq!(encode("mail-1_x.y~z"), "mail-1_x.y~z");
        assert_eq!(encode("../?#&"), "..%2F%3F%23%26");
    }

    #[test]
    fn decode_undoes_encode_and_refuses_a_broken_escape() {
        for value in ["a b/é", "mail", "%41", "100%", ""] {
            assert_eq!(decode(&encode(value)).as_deref(), Some(value));
        }
        assert_eq!(decode("a b").as_deref(), Some("a b"));
        assert_eq!(decode("%4"), None);
        assert_eq!(decode("%g0"), None);
        assert_eq!(decode("%C3"), None);
    }
}
