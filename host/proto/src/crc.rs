//! CRC-32C (Castagnoli, the iSCSI polynomial): the checksum of frames, messages and stored
//! records. Computed by `crc-fast`, which picks the widest carry-less multiplication the
//! CPU has at run time (on x86-64 with VPCLMULQDQ about four times the `crc32` instruction
//! alone on data in cache; the values are the same, so stored records stay readable).

use crc_fast::CrcAlgorithm::Crc32Iscsi;

/// CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC-32C of the bytes whose CRC-32C is `crc` followed by `data`.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.is_empty() {
        return crc;
    }
    // The digest's state is the register before the final inversion.
    let mut digest = crc_fast::Digest::new_with_init_state(Crc32Iscsi, u64::from(!crc));
    digest.update(data);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_check_value_of_crc32c() {
        // The catalogue's check value: CRC of the ASCII digits 1 to 9.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
    }

    proptest! {
        #[test]
        fn appending_gives_the_crc_of_the_whole(
            whole in proptest::collection::vec(any::<u8>(), 0..5000),
            cut in any::<prop::sample::Index>(),
        ) {
            let at = cut.index(whole.len() + 1);
            let (head, rest) = whole.split_at(at);
            let expected = crc32c(&whole);
            prop_assert_eq!(crc32c_append(crc32c(head), rest), expected);
        }

        #[test]
        fn every_length_matches_the_bitwise_definition(data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            prop_assert_eq!(crc32c(&data), bitwise(&data));
        }
    }

    /// The definition, one bit at a time (reflected polynomial 0x82f63b78).
    fn bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for byte in data {
            crc ^= u32::from(*byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
            }
        }
        !crc
    }
}
