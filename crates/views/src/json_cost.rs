//! What parsing JSON costs in memory, counted before the parse so that the memory can be
//! reserved in the caller's budget first (or the parse refused). A value takes tens of
//! bytes of tree where it took two bytes of text: one `[0,0,…]` body of 10 MiB took
//! 298 MB to parse, a note of 8 MiB whose frontmatter was such an array 155 MB.

/// Memory one JSON value may take while a document is parsed, beyond its own bytes: the
/// `/mcp` door builds a JavaScript-shaped tree, then a `serde_json::Value` of the
/// canonical text, and a note is parsed into a `Value`; each node is 32 bytes and
/// vectors grow by doubling. A 10 MiB body of `[0,0,…]`
/// (5.2 million values) peaked at 298 MB, about 57 bytes per value.
pub const VALUE_COST: usize = 64;

/// What parsing `body` may cost in memory beyond its bytes: [`VALUE_COST`] per value
/// and per object key, counted from the structural characters outside strings (each
/// `[`, `{` and `,` begins at most one value, each `:` one key and one value). One pass,
/// no allocation: it runs before the parse, so that the parse can be refused first and
/// its memory reserved in the caller's budget.
pub fn json_parse_cost(body: &[u8]) -> usize {
    let mut values = 1usize;
    let mut i = 0;
    while let Some(&b) = body.get(i) {
        match b {
            b'"' => {
                // A string is skipped with a vector search for its closing quote (one
                // preceded by an even number of backslashes): a note is mostly one long
                // string, and a byte loop over it cost a REST answer a tenth more
                // instructions.
                let start = i + 1;
                let mut from = start;
                loop {
                    let Some(k) = body.get(from..).and_then(|r| memchr::memchr(b'"', r)) else {
                        return values.saturating_mul(VALUE_COST);
                    };
                    let quote = from + k;
                    let escapes = body
                        .get(start..quote)
                        .unwrap_or_default()
                        .iter()
                        .rev()
                        .take_while(|c| **c == b'\\')
                        .count();
                    from = quote + 1;
                    if escapes % 2 == 0 {
                        break;
                    }
                }
                i = from;
                continue;
            }
            b'[' | b'{' | b',' => values += 1,
            b':' => values += 2,
            _ => {}
        }
        i += 1;
    }
    values.saturating_mul(VALUE_COST)
}

/// [`json_parse_cost`] for text that may hold JSON nested in JSON strings (a note's
/// frontmatter, which decoders unwrap string by string): structural characters count
/// wherever they are (prose with commas counts too, so only for a frontmatter).
pub fn nested_json_parse_cost(text: &[u8]) -> usize {
    let values = 1
        + memchr::memchr3_iter(b'[', b'{', b',', text).count()
        + 2 * memchr::memchr_iter(b':', text).count();
    values.saturating_mul(VALUE_COST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parse_cost_counts_values_and_keys_outside_strings() {
        assert_eq!(json_parse_cost(b"0"), VALUE_COST);
        assert_eq!(json_parse_cost(b"[0,0,0]"), 4 * VALUE_COST);
        assert_eq!(json_parse_cost(br#"{"a":1,"b":[2]}"#), 8 * VALUE_COST);
        // Structure inside strings, escaped quotes included, costs nothing.
        assert_eq!(json_parse_cost(br#""[,{:\",]""#), VALUE_COST);
        assert_eq!(json_parse_cost(br#"["\\",0]"#), 3 * VALUE_COST);
        // A 10 MiB array of zeros: far over any share of the default budget.
        let zeros = format!("[{}0]", "0,".repeat(5 * 1024 * 1024));
        assert!(json_parse_cost(zeros.as_bytes()) > 300 * 1024 * 1024);
    }

    /// The byte-at-a-time reading the vector search replaces.
    fn by_bytes(body: &[u8]) -> usize {
        let (mut values, mut in_string, mut escaped) = (1usize, false, false);
        for &b in body {
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' => values += 1,
                b':' => values += 2,
                _ => {}
            }
        }
        values * VALUE_COST
    }

    #[test]
    fn the_string_skipping_agrees_with_a_byte_scan() {
        let alphabet = b"\"\\[]{},:a0 ";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..400 {
            let text: Vec<u8> = (0..len % 40)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            assert_eq!(
                json_parse_cost(&text),
                by_bytes(&text),
                "{:?}",
                String::from_utf8_lossy(&text)
            );
        }
    }

    #[test]
    fn nested_structure_counts_inside_strings() {
        assert_eq!(
            nested_json_parse_cost(br#""{\"a\":[0,0]}""#),
            6 * VALUE_COST
        );
    }
}
