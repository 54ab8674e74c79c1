//! The checksum sealed inside a state file: the BLAKE3 hash of the whole file with the checksum's
//! own 64 hex digits written as `0`s, stored in the safetensors metadata as `checksum_blake3`.
//!
//! BLAKE3 rather than sha256 (store format 1) because every load verifies every byte: over a
//! 4k-token f16 state (50 MB) on this project's 2-core AVX2 machine, sha256 (with SHA-NI) took
//! 36 ms, BLAKE3 20 ms on one core and 12 ms on both (docs/results/history.md, "Module store").
//!
//! Keeping it inside the file (rather than in a sidecar) makes an entry one file, so a single
//! atomic rename publishes it and there is never a data file without its checksum or the reverse;
//! any byte flipped or cut off anywhere, header included, fails verification. The file stays a
//! plain safetensors file for other tools.

use std::ops::Range;

use super::StoreError;

/// Metadata entry holding the checksum.
pub(super) const CHECKSUM_FIELD: &str = "checksum_blake3";

/// Inputs at least this long are hashed on every core (rayon): below it the threads cost more
/// than they save (the blake3 crate's own advice is 128 KiB).
const PARALLEL_BYTES: usize = 1 << 20;

/// What the checksum field holds while the checksum is computed.
const PLACEHOLDER: [u8; 64] = [b'0'; 64];

/// The placeholder value to put in the metadata before serialising.
pub(super) fn placeholder() -> String {
    String::from_utf8_lossy(&PLACEHOLDER).into_owned()
}

/// Replaces the placeholder in freshly serialised `bytes` with the checksum.
pub(super) fn seal(bytes: &mut [u8]) -> Result<(), StoreError> {
    let range = locate(bytes)?;
    if bytes[range.clone()] != PLACEHOLDER {
        return Err(StoreError::Malformed(
            "checksum field is already filled in".to_string(),
        ));
    }
    let digest = hash_parts(&[bytes]);
    bytes[range].copy_from_slice(digest.as_bytes());
    Ok(())
}

/// Checks the checksum sealed in `bytes`.
pub(super) fn verify(bytes: &[u8]) -> Result<(), StoreError> {
    let range = locate(bytes)?;
    let digest = hash_parts(&[&bytes[..range.start], &PLACEHOLDER, &bytes[range.end..]]);
    let stored = &bytes[range];
    if stored == digest.as_bytes() {
        Ok(())
    } else {
        Err(StoreError::Malformed(format!(
            "checksum mismatch: file says {}, contents hash to {digest}",
            String::from_utf8_lossy(stored)
        )))
    }
}

/// The hex BLAKE3 hash of `parts` concatenated.
fn hash_parts(parts: &[&[u8]]) -> String {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        if part.len() >= PARALLEL_BYTES {
            hasher.update_rayon(part);
        } else {
            hasher.update(part);
        }
    }
    hasher.finalize().to_hex().to_string()
}

/// Byte range of the checksum's 64 hex digits, searched for in the safetensors header only.
fn locate(bytes: &[u8]) -> Result<Range<usize>, StoreError> {
    let truncated = || StoreError::Malformed(format!("truncated: only {} bytes", bytes.len()));
    let header_len = bytes
        .get(..8)
        .and_then(|prefix| prefix.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(truncated)?;
    let header_end = usize::try_from(header_len)
        .ok()
        .and_then(|len| len.checked_add(8))
        .filter(|&end| end <= bytes.len())
        .ok_or_else(truncated)?;
    let header = &bytes[8..header_end];
    // serde_json writes compact JSON, which is what the store wrote.
    let needle = format!("\"{CHECKSUM_FIELD}\":\"");
    let mut matches = header
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle.as_bytes())
        .map(|(offset, _)| offset);
    let (Some(offset), None) = (matches.next(), matches.next()) else {
        return Err(StoreError::Malformed(format!(
            "the header does not hold exactly one `{CHECKSUM_FIELD}` entry"
        )));
    };
    let start = 8 + offset + needle.len();
    let end = start + PLACEHOLDER.len();
    let well_formed = bytes.get(end) == Some(&b'"')
        && end < header_end
        && bytes[start..end].iter().all(u8::is_ascii_hexdigit);
    if !well_formed {
        return Err(StoreError::Malformed(format!(
            "`{CHECKSUM_FIELD}` is not 64 hex digits"
        )));
    }
    Ok(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal file shape: 8-byte header length, JSON header, payload.
    fn file_with(header: &str, payload: &[u8]) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    fn sealed_with(payload: &[u8]) -> Vec<u8> {
        let header = format!(
            "{{\"__metadata__\":{{\"{CHECKSUM_FIELD}\":\"{}\"}}}}",
            placeholder()
        );
        let mut bytes = file_with(&header, payload);
        seal(&mut bytes).unwrap();
        bytes
    }

    fn sealed() -> Vec<u8> {
        sealed_with(b"payload bytes")
    }

    #[test]
    fn large_files_hash_in_parallel_to_plain_blake3_and_catch_a_flip() {
        let payload: Vec<u8> = (0..3 * PARALLEL_BYTES + 5)
            .map(|i| (i % 251) as u8)
            .collect();
        let bytes = sealed_with(&payload);
        verify(&bytes).unwrap();
        // The sealed value is what any BLAKE3 tool computes over the file with the placeholder.
        let range = locate(&bytes).unwrap();
        let mut unsealed = bytes.clone();
        unsealed[range.clone()].copy_from_slice(&PLACEHOLDER);
        assert_eq!(
            &bytes[range],
            blake3::hash(&unsealed).to_hex().as_bytes(),
            "the rayon path must hash like the serial one"
        );
        let mut flipped = bytes.clone();
        let deep = bytes.len() - 2 * PARALLEL_BYTES;
        flipped[deep] ^= 0x80;
        assert!(verify(&flipped).is_err(), "flip at byte {deep} undetected");
    }

    #[test]
    fn sealed_bytes_verify_and_any_flip_fails() {
        let bytes = sealed();
        verify(&bytes).unwrap();
        for index in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0x01;
            assert!(verify(&flipped).is_err(), "flip at byte {index} undetected");
        }
        for len in 0..bytes.len() {
            assert!(verify(&bytes[..len]).is_err(), "cut at {len} undetected");
        }
    }

    #[test]
    fn missing_or_doubled_field_is_malformed() {
        assert!(verify(&file_with("{}", b"")).is_err());
        let doubled = format!(
            "{{\"{CHECKSUM_FIELD}\":\"{0}\",\"x\":{{\"{CHECKSUM_FIELD}\":\"{0}\"}}}}",
            placeholder()
        );
        assert!(seal(&mut file_with(&doubled, b"")).is_err());
        let mut resealed = sealed();
        assert!(seal(&mut resealed).is_err(), "sealing twice must fail");
    }
}
