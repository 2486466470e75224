//! Lower-case hexadecimal: keys, key ids and digests as written in files, YAML and logs.

/// `bytes` as lower-case hexadecimal digits.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `N` bytes written as `2 × N` hexadecimal digits (either case) in `text`.
///
/// # Errors
/// What is wrong, in words: the count of digits, or a character that is not one.
pub fn decode<const N: usize>(text: &[u8]) -> Result<[u8; N], String> {
    if text.len() != 2 * N {
        return Err(format!("expected {} hex digits, found {} bytes", 2 * N, text.len()));
    }
    let nibble = |digit: u8| {
        char::from(digit).to_digit(16).ok_or_else(|| format!("'{}' is not a hex digit", digit.escape_ascii()))
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let value = nibble(pair[0])? << 4 | nibble(pair[1])?;
        *byte = u8::try_from(value).map_err(|_| "not a byte".to_owned())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_go_to_hex_and_back() {
        assert_eq!(encode(&[0, 0xab, 0x7f]), "00ab7f");
        assert_eq!(decode::<3>(b"00AB7f"), Ok([0, 0xab, 0x7f]));
        assert!(decode::<3>(b"00ab7").unwrap_err().contains("expected 6 hex digits, found 5"));
        assert!(decode::<2>(b"0g00").unwrap_err().contains("'g' is not a hex digit"));
        assert!(decode::<1>("é".as_bytes()).unwrap_err().contains("is not a hex digit"));
    }
}
