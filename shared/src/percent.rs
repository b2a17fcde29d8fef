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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(encode("a b/é"), "a%20b%2F%C3%A9");
        assert_eq!(encode("mail-1_x.y~z"), "mail-1_x.y~z");
        assert_eq!(encode("../?#&"), "..%2F%3F%23%26");
    }
}
