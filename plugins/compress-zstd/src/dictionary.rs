//! zstd dictionaries: training one from sample payloads (for `linkbus` tooling), reading one
//! from its file, and the id that names it in a step record.

use std::io::Read;
use std::path::Path;

/// Largest dictionary file read (8 MiB). zstd trains 110 KiB by default; a node keeps each
/// loaded dictionary prepared for decoding, and once more per rule level for encoding, each a
/// few times the file's size.
pub const DICTIONARY_BYTES_MAX: u64 = 8 << 20;

/// Fewest samples [`train`] accepts: with fewer zstd's trainer fails or learns nothing useful.
pub const TRAIN_SAMPLES_MIN: usize = 10;

/// Smallest dictionary zstd can write (`ZDICT_DICTSIZE_MIN`).
const DICTIONARY_BYTES_MIN: usize = 256;

/// Trains a dictionary (ZDICT format, at most `dictionary_bytes_max` bytes) on `samples`,
/// typical payloads of the messages it will compress. zstd advises about a hundred times
/// the dictionary's size in samples.
///
/// # Errors
/// In words: too few samples, a size zstd cannot write, or zstd's trainer failing (most often
/// for samples too few or too alike).
pub fn train(samples: &[Vec<u8>], dictionary_bytes_max: usize) -> Result<Vec<u8>, String> {
    if samples.len() < TRAIN_SAMPLES_MIN {
        return Err(format!(
            "training a zstd dictionary needs at least {TRAIN_SAMPLES_MIN} samples, got {} (zstd advises about \
             100 times the dictionary's size in samples)",
            samples.len()
        ));
    }
    if dictionary_bytes_max < DICTIONARY_BYTES_MIN {
        return Err(format!(
            "a zstd dictionary is at least {DICTIONARY_BYTES_MIN} bytes, {dictionary_bytes_max} were asked for"
        ));
    }
    let total: usize = samples.iter().map(Vec::len).sum();
    zstd::dict::from_samples(samples, dictionary_bytes_max).map_err(|e| {
        format!(
            "zstd could not train a dictionary from {} samples ({total} bytes): {e}; give it more samples (about \
             100 times {dictionary_bytes_max} bytes in total) or a smaller dictionary",
            samples.len()
        )
    })
}

/// The id a zstd dictionary (ZDICT format) carries, or `None` when `dictionary` is not one
/// (raw content without the header, or id 0).
pub fn dictionary_id(dictionary: &[u8]) -> Option<u32> {
    zstd::zstd_safe::get_dict_id_from_dict(dictionary).map(std::num::NonZeroU32::get)
}

/// Reads the dictionary file at `path` (relative to the working directory) and checks that
/// zstd can load it: its id and bytes.
pub(crate) fn read_file(path: &Path) -> Result<(u32, Vec<u8>), String> {
    let shown = path.display();
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read dictionary file '{shown}': {e}"))?;
    let mut bytes = Vec::new();
    file.take(DICTIONARY_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read dictionary file '{shown}': {e}"))?;
    if bytes.len() as u64 > DICTIONARY_BYTES_MAX {
        return Err(format!("dictionary file '{shown}' is larger than {DICTIONARY_BYTES_MAX} bytes"));
    }
    let id = dictionary_id(&bytes).ok_or_else(|| {
        format!("'{shown}' is not a zstd dictionary (no dictionary id): train one with `zstd --train`")
    })?;
    if zstd::dict::DecoderDictionary::try_copy(&bytes).is_err() {
        return Err(format!("'{shown}' has a zstd dictionary header but zstd cannot load it"));
    }
    Ok((id, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_refuses_too_few_samples_and_tiny_sizes_in_words() {
        let few = vec![b"{\"id\":1}".to_vec(); 3];
        assert!(train(&few, 4096).unwrap_err().contains("at least 10 samples, got 3"));
        let enough = vec![b"{\"id\":1}".to_vec(); 20];
        assert!(train(&enough, 100).unwrap_err().contains("at least 256 bytes"));
    }

    #[test]
    fn only_a_zdict_dictionary_has_an_id() {
        assert_eq!(dictionary_id(b"raw content is no dictionary"), None);
        assert_eq!(dictionary_id(&[]), None);
    }

    #[test]
    fn a_file_that_is_no_dictionary_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain.dict");
        std::fs::write(&path, b"just some bytes").unwrap();
        let error = read_file(&path).unwrap_err();
        assert!(error.contains("plain.dict") && error.contains("no dictionary id"), "{error}");
        let missing = read_file(&dir.path().join("missing.dict")).unwrap_err();
        assert!(
            missing.contains("cannot read dictionary file") && missing.contains("missing.dict"),
            "{missing}"
        );
    }
}
