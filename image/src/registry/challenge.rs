//! `WWW-Authenticate` challenges (RFC 7235): the one parser of what a
//! registry answers with its 401, `Bearer realm=…,service=…,scope=…` or
//! `Basic realm=…`. Parses only; answering a challenge is the client's.

use std::collections::BTreeMap;

/// A parsed `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// Lower-cased scheme: `bearer` or `basic`.
    pub scheme: String,
    /// Lower-cased parameter names with unquoted values.
    pub params: BTreeMap<String, String>,
}

/// Parses one challenge: `Bearer realm="…",service="…",scope="…"`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = match header.split_once(char::is_whitespace) {
        Some((s, r)) => (s, r),
        None => (header, ""),
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return None;
    }
    let mut params = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() || c == ',' {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') || key.is_empty() {
            return None;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.push(chars.next()?),
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return None;
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' || c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        params.insert(key.to_ascii_lowercase(), value);
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.example/token");
        assert_eq!(c.params["service"], "registry.example");
        assert_eq!(c.params["scope"], "repository:a/b:pull");

        let c = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.params["realm"], "Registry Realm");

        let c = parse_challenge(r#"Bearer realm = "x\"y" , error=insufficient_scope"#).unwrap();
        assert_eq!(c.params["realm"], "x\"y");
        assert_eq!(c.params["error"], "insufficient_scope");

        assert_eq!(parse_challenge("Bearer").unwrap().params.len(), 0);
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
        assert!(parse_challenge(r#"Bearer =x"#).is_none());
        assert!(parse_challenge("").is_none());
    }
}
