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
    let mut in_string = false;
    let mut escaped = false;
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
    values.saturating_mul(VALUE_COST)
}

/// [`json_parse_cost`] for text that may hold JSON nested in JSON strings (a note's
/// frontmatter, which decoders unwrap string by string): structural characters count
/// wherever they are. Only for small texts; prose with commas counts too.
pub fn nested_json_parse_cost(text: &[u8]) -> usize {
    let values = 1 + text
        .iter()
        .map(|b| match b {
            b'[' | b'{' | b',' => 1,
            b':' => 2,
            _ => 0,
        })
        .sum::<usize>();
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

    #[test]
    fn nested_structure_counts_inside_strings() {
        assert_eq!(
            nested_json_parse_cost(br#""{\"a\":[0,0]}""#),
            6 * VALUE_COST
        );
    }
}
