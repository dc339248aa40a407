//! A record in a store, compactly (#46): a paused run's record is JSON of
//! about 4.7 KB for a plan of two tasks (each task's response schema, and
//! the request frame that repeats the tasks), more than a page of an
//! SQLite file. A million parked pauses must fit in 2 GiB, and 100,000 of
//! them in Redis's memory, so both stores keep a record compressed: a
//! format byte, the JSON's length, then the JSON compressed by zstd (the
//! `zstd` crate, level 3) against a dictionary of a typical record,
//! `record.dict`: more than 10x smaller (the tests below hold it to that).
//!
//! The dictionary is part of the file format: a record compressed with it
//! is read back with it, so it never changes. Another dictionary would be
//! another format byte, the old one kept for reading.
//!
//! A record written by an earlier version is JSON text (an SQLite text
//! row, a Redis string that begins with `{`): read as such. What is
//! written now is always compressed.

use std::cell::RefCell;
use std::sync::OnceLock;

use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

use crate::store::PausedRecord;

/// A typical record (a plan of two tasks, ids zeroed): what a record's
/// bytes are found in. Never changed (see the module's doc).
const DICTIONARY: &[u8] = include_bytes!("record.dict");

/// The first byte of a record compressed against [`DICTIONARY`].
const ZSTD_V1: u8 = 1;

/// zstd's default level.
const LEVEL: i32 = 3;

/// The most a record may grow to when read back (a bound on what a
/// corrupt length could make the reader allocate).
const MAX_RECORD: usize = 64 << 20;

fn encoder_dictionary() -> &'static EncoderDictionary<'static> {
    static DICT: OnceLock<EncoderDictionary<'static>> = OnceLock::new();
    DICT.get_or_init(|| EncoderDictionary::copy(DICTIONARY, LEVEL))
}

fn decoder_dictionary() -> &'static DecoderDictionary<'static> {
    static DICT: OnceLock<DecoderDictionary<'static>> = OnceLock::new();
    DICT.get_or_init(|| DecoderDictionary::copy(DICTIONARY))
}

thread_local! {
    /// One compression context per thread (the writer's), reused.
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// `record` as a row keeps it.
pub fn encode(record: &PausedRecord) -> Vec<u8> {
    let json = serde_json::to_vec(record).unwrap_or_default();
    compress(&json)
}

/// `json` compressed, behind the format byte and its length.
pub fn compress(json: &[u8]) -> Vec<u8> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Compressor::with_prepared_dictionary(encoder_dictionary()).ok();
        }
        let mut out = Vec::with_capacity(json.len() / 4 + 16);
        out.push(ZSTD_V1);
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        let compressed = cell.as_mut().and_then(|c| c.compress(json).ok());
        match compressed {
            Some(compressed) => {
                out.extend_from_slice(&compressed);
                out
            }
            // zstd refuses nothing it is given; should it, the JSON is kept
            // as it is (a text row).
            None => json.to_vec(),
        }
    })
}

/// The JSON that `stored` holds, whichever way it was written: a
/// compressed record expanded, JSON text (an earlier version's) as it is;
/// `None` for bytes this version cannot read.
pub fn json_of(stored: &[u8]) -> Option<Vec<u8>> {
    match stored.first() {
        Some(&ZSTD_V1) => expand(stored),
        Some(b'{') => Some(stored.to_vec()),
        _ => None,
    }
}

/// A compressed record expanded; `None` for bytes this version cannot
/// read.
pub fn expand(blob: &[u8]) -> Option<Vec<u8>> {
    let (&format, rest) = blob.split_first()?;
    if format != ZSTD_V1 || rest.len() < 4 {
        return None;
    }
    let (len, compressed) = rest.split_at(4);
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    if len > MAX_RECORD {
        return None;
    }
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Decompressor::with_prepared_dictionary(decoder_dictionary()).ok();
        }
        let json = cell.as_mut()?.decompress(compressed, len).ok()?;
        (json.len() == len).then_some(json)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_a_record_of_this_version() {
        let record: PausedRecord = serde_json::from_slice(DICTIONARY).unwrap();
        let again = serde_json::to_string(&record).unwrap();
        assert!(again.as_bytes() == DICTIONARY, "{again}");
    }

    #[test]
    fn a_record_reads_back_as_it_was_and_is_ten_times_smaller() {
        let text = String::from_utf8(DICTIONARY.to_vec())
            .unwrap()
            .replace(
                "00000000-0000-0000-0000-000000000000",
                "5d0c1f2e-9a41-4c1b-8e0f-7b2d3c4a5e6f",
            )
            .replace("create a report", "back up the database")
            .replace("email it", "rotate the keys");
        let record: PausedRecord = serde_json::from_str(&text).unwrap();
        let row = encode(&record);
        assert!(
            row.len() * 10 < text.len(),
            "{} of {}",
            row.len(),
            text.len()
        );
        let json = json_of(&row).unwrap();
        assert_eq!(
            serde_json::from_slice::<PausedRecord>(&json).unwrap(),
            record
        );
        // The text of an earlier version reads as it is.
        assert_eq!(json_of(text.as_bytes()).unwrap(), text.as_bytes());
    }

    #[test]
    fn bytes_it_cannot_read_are_none_not_a_panic() {
        let row = compress(b"{\"a\":1}");
        for bad in [
            &b""[..],
            &[2, 0, 0, 0, 0],
            &row[..row.len() - 1],
            &[1, 255, 255, 255, 255, 0],
        ] {
            assert_eq!(json_of(bad), None);
            assert_eq!(expand(bad), None);
        }
        let mut longer = row.clone();
        longer[1] += 1;
        assert_eq!(json_of(&longer), None);
        assert_eq!(json_of(b"[1]"), None, "not a record");
    }
}
