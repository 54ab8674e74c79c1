//! The checksum sealed inside a state file: a digest of the whole file with the checksum's own
//! 32 hex digits written as `0`s, stored in the safetensors metadata as `checksum_xxh3`.
//!
//! The digest is XXH3-128 of the XXH3-128s (little-endian) of the file's chunks: the header,
//! then the data in 8 MiB pieces, hashed side by side. Every load verifies every byte, and this
//! is an integrity check (torn or damaged files), not a defence against someone who can write
//! the store (they could seal any file with any hash): XXH3 hashes ~10 GB/s on one core of this
//! project's AVX2 machine, where BLAKE3 (store format 2) took 22 ms on both cores for Gemma's
//! 73 MB state, and sha256 (format 1) 36 ms for 50 MB (docs/results/history.md).
//!
//! Keeping it inside the file (rather than in a sidecar) makes an entry one file, so a single
//! atomic rename publishes it and there is never a data file without its checksum or the reverse;
//! any byte flipped or cut off anywhere, header included, fails verification. The file stays a
//! plain safetensors file for other tools.

use std::ops::Range;

use super::StoreError;

use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_128;

/// Metadata entry holding the checksum.
pub(super) const CHECKSUM_FIELD: &str = "checksum_xxh3";

/// The pieces hashed side by side: large enough that a thread's start-up is noise, small enough
/// that a 4k-token state keeps both cores busy.
const CHUNK_BYTES: usize = 8 << 20;

/// What the checksum field holds while the checksum is computed.
const PLACEHOLDER: [u8; 32] = [b'0'; 32];

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
    let header_end = header_end(bytes)?;
    let digest = digest_hex(&[&bytes[..header_end], &bytes[header_end..]]);
    bytes[range].copy_from_slice(digest.as_bytes());
    Ok(())
}

/// Checks the checksum sealed in `bytes`.
pub(super) fn verify(bytes: &[u8]) -> Result<(), StoreError> {
    let range = locate(bytes)?;
    let header_end = header_end(bytes)?;
    let mut header = bytes[..header_end].to_vec();
    header[range.clone()].copy_from_slice(&PLACEHOLDER);
    let digest = digest_hex(&[&header, &bytes[header_end..]]);
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

/// The 32 hex digits of the digest of `parts`: each part cut into [`CHUNK_BYTES`] pieces, every
/// piece hashed (in parallel), then the pieces' hashes in order. (Where the parts split is part
/// of the digest: a file is always split at the end of its header.)
pub(super) fn digest_hex(parts: &[&[u8]]) -> String {
    let pieces: Vec<&[u8]> = parts
        .iter()
        .flat_map(|part| {
            let empty: &[u8] = &[];
            let pieces: Vec<&[u8]> = part.chunks(CHUNK_BYTES).collect();
            if pieces.is_empty() {
                vec![empty]
            } else {
                pieces
            }
        })
        .collect();
    let hashes: Vec<u128> = if pieces.len() > 1 {
        pieces.par_iter().map(|piece| xxh3_128(piece)).collect()
    } else {
        pieces.iter().map(|piece| xxh3_128(piece)).collect()
    };
    let concatenated: Vec<u8> = hashes.iter().flat_map(|hash| hash.to_le_bytes()).collect();
    format!("{:032x}", xxh3_128(&concatenated))
}

/// Where the safetensors header ends (8 length bytes, then the JSON).
fn header_end(bytes: &[u8]) -> Result<usize, StoreError> {
    let truncated = || StoreError::Malformed(format!("truncated: only {} bytes", bytes.len()));
    let header_len = bytes
        .get(..8)
        .and_then(|prefix| prefix.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(truncated)?;
    usize::try_from(header_len)
        .ok()
        .and_then(|len| len.checked_add(8))
        .filter(|&end| end <= bytes.len())
        .ok_or_else(truncated)
}

/// Byte range of the checksum's 32 hex digits, searched for in the safetensors header only.
fn locate(bytes: &[u8]) -> Result<Range<usize>, StoreError> {
    let header_end = header_end(bytes)?;
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
            "`{CHECKSUM_FIELD}` is not 32 hex digits"
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
    fn large_files_hash_in_pieces_and_catch_a_flip_in_any() {
        let payload: Vec<u8> = (0..3 * CHUNK_BYTES + 5).map(|i| (i % 251) as u8).collect();
        let bytes = sealed_with(&payload);
        verify(&bytes).unwrap();
        // The sealed value is the XXH3-128 of the pieces' XXH3-128s, the header one piece, the
        // data in 8 MiB pieces (the last short), computed here one by one.
        let range = locate(&bytes).unwrap();
        let mut unsealed = bytes.clone();
        unsealed[range.clone()].copy_from_slice(&PLACEHOLDER);
        let header_end = header_end(&bytes).unwrap();
        let mut pieces = vec![&unsealed[..header_end]];
        pieces.extend(unsealed[header_end..].chunks(CHUNK_BYTES));
        assert_eq!(pieces.len(), 5);
        let hashes: Vec<u8> = pieces
            .iter()
            .flat_map(|piece| xxh3_128(piece).to_le_bytes())
            .collect();
        assert_eq!(
            &bytes[range],
            format!("{:032x}", xxh3_128(&hashes)).as_bytes(),
            "the parallel path must hash as the definition"
        );
        for deep in [header_end, header_end + CHUNK_BYTES + 7, bytes.len() - 1] {
            let mut flipped = bytes.clone();
            flipped[deep] ^= 0x80;
            assert!(verify(&flipped).is_err(), "flip at byte {deep} undetected");
        }
        // Two pieces swapped keep every piece's hash, not their order.
        let mut swapped = bytes.clone();
        let (first, second) = (header_end, header_end + CHUNK_BYTES);
        let piece: Vec<u8> = swapped[first..second].to_vec();
        swapped.copy_within(second..second + CHUNK_BYTES, first);
        swapped[second..second + CHUNK_BYTES].copy_from_slice(&piece);
        assert_ne!(swapped, bytes);
        assert!(verify(&swapped).is_err(), "swapped pieces undetected");
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
